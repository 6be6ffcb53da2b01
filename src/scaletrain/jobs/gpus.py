"""The per-node GPU samplers' readings gathered for the report: per GPU utilisation and memory over
time, busy GPU-hours, idle GPUs. The files (``gpus-<host>.jsonl``) are found in the run folder and
read by their writer's reader, :func:`scaletrain.observe.nodesampler.read_samples`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.jobs.runfolder import SEARCH_DEPTH, walk
from scaletrain.jobs.thin import Thinned
from scaletrain.observe.nodesampler import Reading, read_samples, sample_files

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
    """Every sampler's file in the run folder and two levels below."""
    return [path for folder in walk(run_dir, SEARCH_DEPTH) for path in sample_files(folder)]


def read_samplers(files: list[Path]) -> tuple[list[GpuSeries], list[str]]:
    """The series of every GPU and the samplers' notes (a node without a readable GPU says why)."""
    series: dict[tuple[str, str], GpuSeries] = {}
    notes: list[str] = []
    dropped = 0
    for path in files:
        try:
            for line in read_samples(path):     # streamed; a pipe or device in its place is refused
                if isinstance(line, Reading):
                    dropped += _take(line, series)
                elif line.reason:
                    note = f"GPU sampler on {line.host}: {line.reason}"
                    if note not in notes and len(notes) < MAX_NOTES:
                        notes.append(note)
        except OSError as exc:
            notes.append(f"cannot read {path}: {exc.strerror or exc}; its GPUs' readings from "
                         "there on are missing")
    if dropped:
        notes.append(f"{dropped} readings of more than {MAX_SERIES} GPUs left out")
    return [series[k] for k in sorted(series)], notes


def _take(reading: Reading, series: dict[tuple[str, str], GpuSeries]) -> int:
    """One reading into ``series``; the count of its GPUs' readings left out (past MAX_SERIES)."""
    dropped = 0
    for dev, (util, mem) in reading.devices.items():
        key = (reading.host, dev)
        if key not in series and len(series) >= MAX_SERIES:
            dropped += 1
            continue
        one = series.setdefault(key, GpuSeries(host=reading.host, device=dev, interval_s=reading.interval_s))
        one.add(reading.t, util, mem)
    return dropped


def idle(series: list[GpuSeries]) -> list[GpuSeries]:
    """The GPUs whose mean utilisation stayed under IDLE_PCT."""
    return [s for s in series if (s.mean_util() or 0.0) < IDLE_PCT]
