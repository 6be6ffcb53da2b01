"""The per-node GPU samplers' files (``gpus-<host>.jsonl``, :mod:`scaletrain.observe.nodesampler`)
read back for the report: per GPU utilisation and memory over time, busy GPU-hours, idle GPUs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.contract.files import GPU_SAMPLES_PREFIX
from scaletrain.jobs.runfolder import SEARCH_DEPTH, as_object, iter_records, walk
from scaletrain.jobs.thin import Thinned

IDLE_PCT = 30.0          # a GPU busier than this on average is not called idle
HINT = ("feed it faster: more DataLoader workers (num_workers) and pinned memory, CPU cores bound near the GPU "
        "(--cpus-per-gpu), or a larger batch per GPU")


MAX_SERIES = 4096       # GPUs read back (512 nodes of 8); the rest are counted in a note
MAX_NOTES = 100         # distinct sampler notes ("no GPU readable on node x") listed


@dataclass(kw_only=True)
class GpuSeries:
    """One GPU's readings: (time, utilisation %, memory GB), thinned for the charts as they are
    read, with the sums the figures need kept whole (a month of samples stays small)."""

    host: str
    device: str
    interval_s: float
    readings: Thinned[tuple[float, float | None, float | None]] = field(default_factory=Thinned)
    first_t: float | None = None        # the earliest reading's time
    util_sum: float = 0.0               # of the readings that have a utilisation
    util_count: int = 0

    def add(self, when: float, util: float | None, mem: float | None) -> None:
        """Take one reading."""
        self.readings.add((when, util, mem))
        self.first_t = when if self.first_t is None else min(self.first_t, when)
        if util is not None:
            self.util_sum += util
            self.util_count += 1

    @property
    def points(self) -> list[tuple[float, float | None, float | None]]:
        """The readings kept for the charts (evenly spaced, at most 2 x MAX_POINTS)."""
        return self.readings.points

    @property
    def label(self) -> str:
        """``host:GPU``, as the report names it."""
        return f"{self.host}:{self.device}"

    def mean_util(self) -> float | None:
        """Mean utilisation over the readings that have one."""
        return self.util_sum / self.util_count if self.util_count else None

    def busy_hours(self) -> float:
        """GPU-hours busy: each reading's utilisation over its sampling interval."""
        return self.util_sum / 100 * self.interval_s / 3600


def sampler_files(run_dir: Path) -> list[Path]:
    """Every ``gpus-*.jsonl`` in the run folder and two levels below."""
    found: list[Path] = []
    for folder in walk(run_dir, SEARCH_DEPTH):
        found += sorted(folder.glob(f"{GPU_SAMPLES_PREFIX}*.jsonl"))
    return found


def read_samplers(files: list[Path]) -> tuple[list[GpuSeries], list[str]]:
    """The series of every GPU and the samplers' notes (a node without a readable GPU says why)."""
    series: dict[tuple[str, str], GpuSeries] = {}
    notes: list[str] = []
    dropped = 0
    for path in files:
        host, interval = path.stem[len(GPU_SAMPLES_PREFIX):], 10.0
        try:
            for rec in iter_records(path, as_object):   # streamed; a pipe or device in its place is refused
                host, interval, dropped = _take(rec, host, interval, series, notes, dropped)
        except OSError as exc:
            notes.append(f"cannot read {path}: {exc.strerror or exc}; its GPUs' readings from "
                         "there on are missing")
    if dropped:
        notes.append(f"{dropped} readings of more than {MAX_SERIES} GPUs left out")
    return [series[k] for k in sorted(series)], notes


def _take(rec: dict[str, Any], host: str, interval: float,
          series: dict[tuple[str, str], GpuSeries], notes: list[str],
          dropped: int) -> tuple[str, float, int]:
    """One record of a sampler file into ``series``: (host, interval, readings dropped) after it."""
    if rec.get("type") == "sampler":
        host = str(rec.get("host", host))[:200]
        interval = _number(rec.get("interval_s"), low=1e-3) or interval
        note = f"GPU sampler on {host}: {rec['reason']}" if rec.get("reason") else None
        if note and note not in notes and len(notes) < MAX_NOTES:
            notes.append(note)
        return host, interval, dropped
    devices = rec.get("devices")
    when = _number(rec.get("t"))
    if not isinstance(devices, dict) or when is None:
        return host, interval, dropped     # not a reading the sampler wrote (a hand-edited line)
    for dev, fig in devices.items():
        if not isinstance(fig, dict):
            continue
        key = (host, str(dev))
        if key not in series and len(series) >= MAX_SERIES:
            dropped += 1
            continue
        one = series.setdefault(key, GpuSeries(host=host, device=str(dev), interval_s=interval))
        one.add(when, _number(fig.get("util_pct")), _number(fig.get("mem_gb")))
    return host, interval, dropped


def _number(value: Any, *, low: float = 0.0) -> float | None:
    """A finite reading from ``low`` up, else None (a hand-edited or garbled value is no reading)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if low <= value <= 1e15 else None


def idle(series: list[GpuSeries]) -> list[GpuSeries]:
    """The GPUs whose mean utilisation stayed under IDLE_PCT."""
    return [s for s in series if (s.mean_util() or 0.0) < IDLE_PCT]
