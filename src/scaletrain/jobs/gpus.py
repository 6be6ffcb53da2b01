"""The per-node GPU samplers' readings gathered for the report: per GPU utilisation and memory over
time, busy GPU-hours, idle GPUs. The files (``gpus-<host>.jsonl``) are found in the run folder and
read by their writer's readers (:mod:`scaletrain.observe.nodesampler`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.jobs.runfolder import SEARCH_DEPTH, walk
from scaletrain.jobs.thin import Thinned
from scaletrain.observe.nodesampler import Reading, read_samples, sample_files, sample_readings, summarize

IDLE_PCT = 30.0          # a GPU busier than this on average is not called idle
HINT = ("feed it faster: more DataLoader workers (num_workers) and pinned memory, CPU cores bound near the GPU "
        "(--cpus-per-gpu), or a larger batch per GPU")


MAX_SERIES = 4096       # GPUs whose readings are kept for the charts when a file must be read whole
CHART_GPUS = 64         # GPUs drawn in the report's charts: the least busy ones (their figures: all GPUs)
CHART_READINGS = 300    # readings read from a file for a GPU drawn (spread over the file)
MAX_NOTES = 100         # distinct sampler notes ("no GPU readable on node x") listed


@dataclass(kw_only=True)
class GpuSeries:
    """One GPU's figures (every reading counted) and, for a GPU the charts draw, its readings:
    (time, utilisation %, memory GB), thinned to a bound."""

    host: str
    device: str
    interval_s: float
    readings: Thinned[tuple[float, float | None, float | None]] = field(default_factory=Thinned)
    first_t: float | None = None        # the earliest reading's time
    util_sum: float = 0.0               # of the readings that have a utilisation
    util_count: int = 0
    busy_s: float = 0.0                 # each reading's utilisation over its interval, summed

    def add(self, when: float, util: float | None, mem: float | None, *, keep: bool = True) -> None:
        """Take one reading (into the chart's points too with ``keep``)."""
        if keep:
            self.readings.add((when, util, mem))
        self.first_t = when if self.first_t is None else min(self.first_t, when)
        if util is not None:
            self.util_sum += util
            self.util_count += 1
            self.busy_s += util / 100 * self.interval_s

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
        return self.busy_s / 3600


def sampler_files(run_dir: Path) -> list[Path]:
    """Every sampler's file in the run folder and two levels below."""
    return [path for folder in walk(run_dir, SEARCH_DEPTH) for path in sample_files(folder)]


def read_samplers(files: list[Path]) -> tuple[list[GpuSeries], list[str]]:
    """The figures of every GPU and the samplers' notes (a node without a readable GPU says why).

    A file whose readings carry their totals is read at its two ends (:func:`summarize`), and
    only a GPU the charts draw has readings read from its file, a few hundred spread over it: a
    job of 6,000 nodes is a few lines a file, not every reading (docs/scale.md). Older files are
    read whole, as before."""
    series: dict[tuple[str, str], GpuSeries] = {}
    notes: list[str] = []
    summarized: dict[tuple[str, str], Path] = {}
    for path in files:
        try:
            found = summarize(path)
            if found is None:
                _read_whole(path, series, notes)
                continue
        except OSError as exc:
            notes.append(f"cannot read {path}: {exc.strerror or exc}; its GPUs' readings from "
                         "there on are missing")
            continue
        if found.reason:
            _note(notes, f"GPU sampler on {found.host}: {found.reason}")
        for dev, (count, util_sum, busy) in found.totals.items():
            one = series.setdefault((found.host, dev), GpuSeries(host=found.host, device=dev,
                                                                 interval_s=found.interval_s))
            one.util_count += count
            one.util_sum += util_sum
            one.busy_s += busy
            if found.first_t is not None:
                one.first_t = found.first_t if one.first_t is None else min(one.first_t, found.first_t)
            summarized[(found.host, dev)] = path
    ordered = [series[k] for k in sorted(series)]
    _chart(ordered, summarized, notes)
    return ordered, notes


def _chart(ordered: list[GpuSeries], summarized: dict[tuple[str, str], Path], notes: list[str]) -> None:
    """Keep chart readings for the CHART_GPUS least busy GPUs only; read theirs from their files."""
    drawn = sorted(ordered, key=lambda g: (g.mean_util() is None, g.mean_util() or 0.0, g.label))[:CHART_GPUS]
    keep = {id(g) for g in drawn}
    for g in ordered:
        if id(g) not in keep:
            g.readings = Thinned()
    wanted: dict[Path, list[GpuSeries]] = {}
    for g in drawn:
        path = summarized.get((g.host, g.device))
        if path is not None:
            wanted.setdefault(path, []).append(g)
    for path, gpus in wanted.items():
        try:
            readings = sample_readings(path, CHART_READINGS)
        except OSError:
            continue
        for reading in readings:
            for g in gpus:
                util, mem = reading.devices.get(g.device, (None, None))
                g.readings.add((reading.t, util, mem))
    if len(ordered) > CHART_GPUS:
        notes.append(f"the charts draw the {CHART_GPUS} least busy of {len(ordered)} GPUs; "
                     "the figures count every GPU")


def _note(notes: list[str], note: str) -> None:
    if note not in notes and len(notes) < MAX_NOTES:
        notes.append(note)


def _read_whole(path: Path, series: dict[tuple[str, str], GpuSeries], notes: list[str]) -> None:
    """Stream a file whose readings carry no totals (a sampler from before them)."""
    try:
        for line in read_samples(path):     # streamed; a pipe or device in its place is refused
            if isinstance(line, Reading):
                _take(line, series)
            elif line.reason:
                _note(notes, f"GPU sampler on {line.host}: {line.reason}")
    except OSError as exc:
        notes.append(f"cannot read {path}: {exc.strerror or exc}; its GPUs' readings from "
                     "there on are missing")


def _take(reading: Reading, series: dict[tuple[str, str], GpuSeries]) -> None:
    """One reading into ``series`` (its points kept for the first MAX_SERIES GPUs only)."""
    for dev, (util, mem) in reading.devices.items():
        key = (reading.host, dev)
        one = series.get(key)
        if one is None:
            one = series[key] = GpuSeries(host=reading.host, device=dev, interval_s=reading.interval_s)
        one.add(reading.t, util, mem, keep=len(series) <= MAX_SERIES)


def idle(series: list[GpuSeries]) -> list[GpuSeries]:
    """The GPUs whose mean utilisation stayed under IDLE_PCT."""
    return [s for s in series if (s.mean_util() or 0.0) < IDLE_PCT]
