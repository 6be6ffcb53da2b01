"""What a :class:`scaletrain.Monitor` is asked to do: one validated, typed object.

``Monitor(run_dir, total_steps=..., every=...)`` builds a :class:`MonitorConfig` from its
keyword arguments; ``Monitor(run_dir, MonitorConfig(...))`` takes one made beforehand (to
share between runs, or to build from a program's own options).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from scaletrain.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class MonitorConfig:
    """A Monitor's settings, checked when made.

    Args:
        total_steps: steps in the run, for the progress bar and ETA.
        console: print progress on rank 0 (a bar on a terminal, plain lines elsewhere).
        jsonl: write ``run_dir/metrics.jsonl``.
        jsonl_every: a JSONL line for every N-th step. Left out: a line per step for the first
            100 steps, then about one per 10 ms of training, i.e. every step when steps take 10 ms
            or more (formatting a line costs ~1% of a 0.25 ms step; see docs/benchmarks.md).
            The summary, the console and the cross-rank checks see every step either way.
        tensorboard: write TensorBoard event files to ``run_dir/tensorboard`` (needs the
            ``monitor`` extra).
        every: steps between cross-rank exchanges (straggler and idle-device checks). Left
            out: 100, spaced further to about one exchange a second when steps are shorter
            than 10 ms (the ranks agree on it from the exchanged figures).
        flush_s: seconds between hand-overs of the buffered steps to the sinks: the console
            lags and a killed process loses at most this much (plus the writer's backlog).
        log_every: where the console prints plain lines (not a terminal: a batch log), a line
            for steps whose number is a multiple of this...
        log_interval_s: ...and at least this many seconds after the line before (as tqdm's
            ``mininterval``): short steps give a line every ``log_interval_s`` seconds, not
            millions in a day's log; steps of seconds still give one every ``log_every``
            steps. The last step always gets its line. 0: every ``log_every`` steps.
        warmup: first steps left out of the summary's medians and rates (compilation, caches).
        flops_per_sample: training FLOPs per sample (forward + backward), for MFU; see
            :func:`scaletrain.observe.flops.count_train_flops`.
        peak_flops: the device's peak FLOP/s; default from a table of datasheet figures.
        device_sampler: "auto" (NVML/AMD SMI for the node's GPUs), None (off), or a backend:
            an object with ``read() -> {device id: Sample}`` and ``close()`` (tests pass a fake
            one). Either way only the node's lowest local rank samples; the others start nothing.
        sample_interval_s: seconds between readings of the node's devices.
        device_id: this rank's device as the sampler names it; default
            :func:`scaletrain.observe.devices.device_key` of the device.
        num_workers: the loader's worker count, quoted in idle-device hints.
        stream: where the console writes (default: standard error).
        start_step: the step this run resumes from (what ``Checkpointer.load_latest`` returned);
            written in the run's ``start`` line of ``metrics.jsonl``, where ``scaletrain status``
            and ``report`` add it to this run's step numbers (which start at 1 in every run).
    """

    total_steps: int | None = None
    console: bool = True
    jsonl: bool = True
    jsonl_every: int | None = None
    tensorboard: bool = False
    every: int | None = None
    flush_s: float = 1.0
    log_every: int = 10
    log_interval_s: float = 30.0
    warmup: int = 1
    flops_per_sample: float | None = None
    peak_flops: float | None = None
    device_sampler: Any = "auto"
    sample_interval_s: float = 2.0
    device_id: str | None = None
    num_workers: int | None = None
    stream: Any = None
    start_step: int = 0

    def __post_init__(self) -> None:
        if ((self.every is not None and self.every < 1) or self.log_every < 1
                or (self.jsonl_every is not None and self.jsonl_every < 1) or self.warmup < 0
                or not self.flush_s > 0):
            raise UsageError("Monitor: every, log_every and jsonl_every must be >= 1, flush_s > 0 and "
                             "warmup >= 0",
                             "e.g. Monitor(run_dir, every=100, flush_s=1.0, log_every=10, warmup=1)")
        if self.total_steps is not None and self.total_steps < 1:
            raise UsageError(f"Monitor: total_steps must be positive, got {self.total_steps}",
                             "leave it out when the number of steps is not known")
        if not self.log_interval_s >= 0 or not self.sample_interval_s > 0:
            raise UsageError("Monitor: log_interval_s must be >= 0 and sample_interval_s > 0",
                             "e.g. Monitor(run_dir, log_interval_s=30, sample_interval_s=2)")


def make_config(config: MonitorConfig | None, options: Mapping[str, Any]) -> MonitorConfig:
    """``config`` (default: the defaults) with ``options`` (MonitorConfig's field names) over it."""
    names = {f.name for f in dataclasses.fields(MonitorConfig)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise UsageError(f"Monitor: no setting {', '.join(map(repr, unknown))}",
                         f"the settings are: {', '.join(sorted(names))}")
    if config is not None and not isinstance(config, MonitorConfig):
        raise UsageError(f"Monitor: config must be a MonitorConfig, got {type(config).__name__}",
                         "e.g. Monitor(run_dir, MonitorConfig(total_steps=1000)), or keyword arguments")
    return dataclasses.replace(config or MonitorConfig(), **options)
