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
from scaletrain.settings import Bad, anything, boolean, check_fields, count, number, setting, text

_STEPS = 10**15          # more steps than any run takes; a bound so that arithmetic stays small
_DAY_S = 86400.0         # an interval longer than a day is a slip of the keyboard


def _sampler(value: Any) -> Any:
    if value is None or value == "auto" or (hasattr(value, "read") and hasattr(value, "close")):
        return value
    raise Bad('"auto", None, or an object with read() and close()')


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

    total_steps: int | None = setting("steps in the run, for the progress bar and ETA", default=None,
                                      check=count(high=_STEPS))
    console: bool = setting("print progress on rank 0", default=True, check=boolean())
    jsonl: bool = setting("write run_dir/metrics.jsonl", default=True, check=boolean())
    jsonl_every: int | None = setting("a JSONL line for every N-th step", default=None, check=count(high=_STEPS))
    tensorboard: bool = setting("write TensorBoard event files", default=False, check=boolean())
    every: int | None = setting("steps between cross-rank exchanges", default=None, check=count(high=_STEPS))
    flush_s: float = setting("seconds between hand-overs to the sinks", default=1.0,
                             check=number(above=0, high=_DAY_S), unit="seconds")
    log_every: int = setting("a plain console line every N steps", default=10, check=count(high=_STEPS))
    log_interval_s: float = setting("seconds at least between plain console lines", default=30.0,
                                    check=number(low=0, high=_DAY_S), unit="seconds")
    warmup: int = setting("first steps left out of the summary", default=1, check=count(low=0, high=_STEPS))
    flops_per_sample: float | None = setting("training FLOPs per sample, for MFU", default=None,
                                             check=number(above=0), unit="FLOPs")
    peak_flops: float | None = setting("the device's peak FLOP/s, for MFU", default=None,
                                       check=number(above=0), unit="FLOP/s")
    device_sampler: Any = setting('"auto", None or an object with read() and close()', default="auto",
                                  check=_sampler)
    sample_interval_s: float = setting("seconds between readings of the node's devices", default=2.0,
                                       check=number(above=0, high=_DAY_S), unit="seconds")
    device_id: str | None = setting("this rank's device as the sampler names it", default=None, check=text())
    num_workers: int | None = setting("the loader's worker count", default=None, check=count(low=0))
    stream: Any = setting("where the console writes (a text stream)", default=None, check=anything())
    start_step: int = setting("the step this run resumes from", default=0, check=count(low=0, high=_STEPS))

    def __post_init__(self) -> None:
        check_fields(self, owner="Monitor")


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
