"""The Monitor's running statistics: the current exchange window and the run after warm-up.

The Monitor buffers one tuple per step (:data:`scaletrain.observe.records.STEP_FIELDS`) and folds
each slice of new tuples in here, on the training thread, at an exchange or a hand-over (never
per step). Columns are taken with ``zip`` and summed with ``sum``, in C.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from scaletrain.observe.records import Record

RECENT_STEPS = 10_000  # step times kept for the summary's median (the last ones)


def median(values: list[float]) -> float:
    """statistics.median without its generality (it runs every exchange on the training thread)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class StepStats:
    """Step times, data and communication waits, samples and tokens, as the steps come in.

    ``window_*`` cover the steps since the last :meth:`take_window` (the cross-rank exchange);
    the run figures cover every step after the first ``warmup`` ones, with the last
    :data:`RECENT_STEPS` step times kept for the median.
    """

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.window_steps: list[float] = []
        self.window_wait = 0.0
        self.window_comm: list[float] = []
        self.samples = 0                  # every step's samples, warm-up included
        # after warm-up: time, wait, samples, tokens, steps
        self._sums: list[float] = [0.0, 0.0, 0, 0, 0]
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)

    def add(self, new: list[tuple[Any, ...]]) -> None:
        """Fold a slice of step tuples (in step order) into the window and the run."""
        if not new:
            return
        steps, _, times, samples, tokens, _, waits, comms, _ = zip(*new)
        self.window_steps += times
        self.window_wait += sum(waits)
        if comms.count(None) != len(comms):  # watch() was called: some steps have a comm wait
            self.window_comm += [c for c in comms if c is not None]
        self.samples += sum(samples)
        skip = max(0, self.warmup - (steps[0] - 1))  # steps of this slice still in warm-up
        if skip < len(new):
            sums = self._sums
            sums[0] += sum(times[skip:])
            sums[1] += sum(waits[skip:])
            sums[2] += sum(samples[skip:])
            sums[3] += sum(filter(None, tokens[skip:]))
            sums[4] += len(new) - skip
            self._recent.extend(times[skip:])

    def take_window(self) -> tuple[float, float | None, float]:
        """(median step time, median comm wait or None, data-wait fraction) of the window; resets it."""
        steps = self.window_steps or [0.0]
        total = sum(steps) or 1e-9
        out = (median(steps), median(self.window_comm) if self.window_comm else None,
               self.window_wait / total)
        self.window_steps, self.window_wait, self.window_comm = [], 0.0, []
        return out

    def run_figures(self, *, world_size: int, mfu_scale: float | None) -> Record:
        """Medians and rates over the steps after warm-up (the summary's figures)."""
        time_s, wait_s, samples, tokens, count = self._sums
        recent = list(self._recent)
        out: Record = {"step_s_median": median(recent) if recent else None,
                       "step_s_mean": time_s / count if count else None}
        if count and time_s > 0:
            out["samples_per_s_per_device"] = samples / time_s
            out["samples_per_step"] = samples / count
            out["samples_per_s"] = samples * world_size / time_s
            out["tokens_per_s"] = tokens * world_size / time_s if tokens else None
            out["data_wait_frac"] = wait_s / time_s
            out["mfu"] = mfu_scale * samples / time_s if mfu_scale and samples else None
        return out
