"""The per-node GPU samplers' files (``gpus-<host>.jsonl``, :mod:`scaletrain.observe.nodesampler`)
read back for the report: per GPU utilisation and memory over time, busy GPU-hours, idle GPUs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.contract import GPU_SAMPLES_PREFIX
from scaletrain.jobs.runfolder import SEARCH_DEPTH, as_object, iter_records, walk

IDLE_PCT = 30.0          # a GPU busier than this on average is not called idle
HINT = ("feed it faster: more DataLoader workers (num_workers) and pinned memory, CPU cores bound near the GPU "
        "(--cpus-per-gpu), or a larger batch per GPU")


@dataclass(kw_only=True)
class GpuSeries:
    """One GPU's readings: (time, utilisation %, memory GB)."""

    host: str
    device: str
    interval_s: float
    points: list[tuple[float, float | None, float | None]] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``host:GPU``, as the report names it."""
        return f"{self.host}:{self.device}"

    def mean_util(self) -> float | None:
        """Mean utilisation over the readings that have one."""
        values = [u for _, u, _ in self.points if u is not None]
        return sum(values) / len(values) if values else None

    def busy_hours(self) -> float:
        """GPU-hours busy: each reading's utilisation over its sampling interval."""
        return sum((u or 0.0) / 100 * self.interval_s for _, u, _ in self.points) / 3600


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
    for path in files:
        host, interval = path.stem[len(GPU_SAMPLES_PREFIX):], 10.0
        try:
            records = list(iter_records(path, as_object))      # streamed; a pipe or device in its place is skipped
        except OSError:
            continue
        for rec in records:
            if rec.get("type") == "sampler":
                host = str(rec.get("host", host))[:200]
                interval = _number(rec.get("interval_s"), low=1e-3) or interval
                if rec.get("reason"):
                    notes.append(f"GPU sampler on {host}: {rec['reason']}")
                continue
            devices = rec.get("devices")
            when = _number(rec.get("t"))
            if not isinstance(devices, dict) or when is None:
                continue      # not a reading the sampler wrote (a hand-edited line)
            for dev, fig in devices.items():
                if not isinstance(fig, dict):
                    continue
                one = series.setdefault((host, str(dev)), GpuSeries(host=host, device=str(dev), interval_s=interval))
                one.points.append((when, _number(fig.get("util_pct")), _number(fig.get("mem_gb"))))
    return [series[k] for k in sorted(series)], notes


def _number(value: Any, *, low: float = 0.0) -> float | None:
    """A finite reading from ``low`` up, else None (a hand-edited or garbled value is no reading)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if low <= value <= 1e15 else None


def idle(series: list[GpuSeries]) -> list[GpuSeries]:
    """The GPUs whose mean utilisation stayed under IDLE_PCT."""
    return [s for s in series if (s.mean_util() or 0.0) < IDLE_PCT]
