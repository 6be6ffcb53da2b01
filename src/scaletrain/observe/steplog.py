"""The Monitor's buffered steps, kept as columns so that recording a step stays cheap.

``Monitor.step`` runs on the training thread once per step, so it does as little as it can:
it appends the step's end time and its sample count to two lists, and puts anything else (a
kept loss, a data or communication wait, tokens, extra fields) in a dict keyed by step number,
only when there is something to put. Step times, the ``t`` field and the rows of
:data:`scaletrain.observe.records.STEP_FIELDS` are derived later, off the step path: by the
statistics at an exchange, and by the writer thread for the lines it writes. Compared with one
9-field tuple per step this halves the step path (see docs/benchmarks.md, "Monitor overhead").
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

# a step shorter than this is recorded as this long (no division by zero in the rates)
MIN_STEP_S = 1e-9


class StepColumns:
    """Steps ``first`` .. ``first + len - 1`` of one process, as columns.

    Attributes:
        first: the step number of the first buffered step.
        start: the clock reading (``time.perf_counter``) at which the first step began.
        t0: the Monitor's start on the same clock (a record's ``t`` is ``end - t0``).
        ends: each step's end on that clock.
        samples: each step's sample count.
        losses, waits, comms, tokens, extras: by step number, only for the steps that have one
            (the Monitor keeps only the losses a sink will show).
        starts: by step number, a step's start when it was not the previous step's end
            (``Monitor.start()`` called between steps).
    """

    __slots__ = ("first", "start", "t0", "ends", "samples", "losses", "waits", "comms", "tokens", "extras",
                 "starts")

    def __init__(self, first: int, start: float, t0: float) -> None:
        self.first = first
        self.start = start
        self.t0 = t0
        self.ends: list[float] = []
        self.samples: list[int | float] = []
        self.losses: dict[int, Any] = {}
        self.waits: dict[int, float] = {}
        self.comms: dict[int, float] = {}
        self.tokens: dict[int, int] = {}
        self.extras: dict[int, dict[str, Any]] = {}
        self.starts: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self.ends)

    def following(self) -> "StepColumns":
        """An empty buffer for the steps after these (the next step starts at the last end)."""
        return StepColumns(self.first + len(self.ends), self.ends[-1] if self.ends else self.start, self.t0)

    def add_more(self, n: int, more: dict[str, Any]) -> None:
        """Step ``n``'s less common figures: ``tokens``, a given ``data_wait_s`` (it replaces
        what ``Monitor.data()`` measured), and extra fields (the rest of ``more``, taken)."""
        tokens = more.pop("tokens", None)
        if tokens is not None:
            self.tokens[n] = tokens
        if "data_wait_s" in more:
            wait = more.pop("data_wait_s")
            if wait is not None:
                self.waits.pop(n, None)
                if wait:
                    self.waits[n] = float(wait)
        if more:
            self.extras[n] = more

    def step_times(self, lo: int = 0, hi: int | None = None) -> list[float]:
        """The durations of steps at indices ``lo`` .. ``hi - 1`` (at least :data:`MIN_STEP_S`)."""
        ends = self.ends
        hi = len(ends) if hi is None else hi
        if lo >= hi:
            return []
        before = ends[lo - 1] if lo > 0 else self.start
        times = [b - a for a, b in zip([before, *ends[lo:hi - 1]], ends[lo:hi])]
        if self.starts:
            first = self.first
            for step, began in self.starts.items():
                if lo <= step - first < hi:
                    times[step - first - lo] = ends[step - first] - began
        if min(times) < MIN_STEP_S:
            times = [t if t >= MIN_STEP_S else MIN_STEP_S for t in times]
        return times

    def step_time(self, i: int) -> float:
        """The duration of the step at index ``i``."""
        began = self.starts.get(self.first + i)
        if began is None:
            began = self.ends[i - 1] if i > 0 else self.start
        return max(self.ends[i] - began, MIN_STEP_S)

    def row(self, i: int) -> tuple[Any, ...]:
        """The step at index ``i`` as a :data:`~scaletrain.observe.records.STEP_FIELDS` tuple."""
        step = self.first + i
        return (step, self.ends[i] - self.t0, self.step_time(i), self.samples[i], self.tokens.get(step),
                self.losses.get(step), self.waits.get(step, 0.0), self.comms.get(step), self.extras.get(step))

    def in_range(self, table: dict[int, Any], lo: int) -> list[Any]:
        """The values of ``table`` (one of the by-step dicts) for the steps from index ``lo`` on."""
        if lo == 0:
            return list(table.values())
        cut = self.first + lo
        return [v for k, v in table.items() if k >= cut]

    @classmethod
    def build(cls, step_times: Sequence[float], samples: Iterable[int | float], *, first: int = 1,
              start: float = 0.0, t0: float = 0.0, losses: Sequence[Any] | None = None,
              waits: Sequence[float] | None = None, tokens: Sequence[int | None] | None = None,
              extras: Sequence[dict[str, Any] | None] | None = None) -> "StepColumns":
        """Columns from per-step values (tests, benchmarks): ends are the running sum of the times."""
        cols = cls(first, start, t0)
        end = start
        for t in step_times:
            end += t
            cols.ends.append(end)
        cols.samples = list(samples)
        for table, values in ((cols.losses, losses), (cols.waits, waits), (cols.tokens, tokens),
                              (cols.extras, extras)):
            for i, value in enumerate(values or ()):
                if value is not None and (table is not cols.waits or value != 0.0):
                    table[first + i] = value
        return cols
