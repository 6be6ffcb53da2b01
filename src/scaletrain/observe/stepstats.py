"""The Monitor's running statistics: the current exchange window and the run after warm-up.

The Monitor buffers its steps as columns (:class:`scaletrain.observe.steplog.StepColumns`) and
folds the steps added since the last fold in here, on the training thread, at an exchange or a
hand-over (never per step). Columns are sliced and summed with ``sum``, in C; the window's
median is taken over at most :data:`MEDIAN_SAMPLE` evenly spaced steps.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from scaletrain.observe.records import Record
from scaletrain.observe.steplog import StepColumns

RECENT_STEPS = 10_000  # step times kept for the summary's median (the last ones)
# a window's median step time from at most this many evenly spaced steps: sorting every step of
# a second's window of 0.25 ms steps would cost more than recording them; the straggler and
# idle checks compare ranks by 10% and more, far above what the sample moves the median
MEDIAN_SAMPLE = 1024


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
        self.samples: int | float = 0     # every step's samples, warm-up included
        # after warm-up: time, wait, samples, tokens, steps
        self._sums: list[float] = [0.0, 0.0, 0, 0, 0]
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)

    def add(self, cols: StepColumns, lo: int = 0) -> None:
        """Fold the steps of ``cols`` from index ``lo`` on into the window and the run."""
        n = len(cols)
        if lo >= n:
            return
        times = cols.step_times(lo)
        samples = cols.samples[lo:] if lo else cols.samples
        self.window_steps += times
        waits = cols.in_range(cols.waits, lo) if cols.waits else ()
        self.window_wait += sum(waits)
        if cols.comms:  # watch() was called: steps have a comm wait
            self.window_comm += cols.in_range(cols.comms, lo)
        self.samples += sum(samples)
        first = cols.first + lo                       # the step number of times[0]
        skip = max(0, self.warmup - (first - 1))      # steps of this slice still in warm-up
        if skip < len(times):
            sums = self._sums
            if skip:
                times, samples = times[skip:], samples[skip:]
                waits = cols.in_range(cols.waits, lo + skip)
            sums[0] += sum(times)
            sums[1] += sum(waits)
            sums[2] += sum(samples)
            if cols.tokens:
                sums[3] += sum(filter(None, cols.in_range(cols.tokens, lo + skip)))
            sums[4] += len(times)
            self._recent.extend(times)

    def take_window(self) -> tuple[float, float | None, float]:
        """(median step time, median comm wait or None, data-wait fraction) of the window; resets it."""
        steps = self.window_steps or [0.0]
        total = sum(steps) or 1e-9
        if len(steps) > MEDIAN_SAMPLE:
            steps = steps[::-(-len(steps) // MEDIAN_SAMPLE)]
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
