"""Where a Monitor's records go: the console, a JSONL file, TensorBoard event files.

Every sink has the same three methods: ``write(batch)`` for a :class:`StepBatch` of buffered
steps, ``event(record)`` for a finding or a note, and ``close(summary)``. Batches keep the step
path cheap: a sink sees steps every second or so, never one system call per step, and builds
only what it shows (the console formats the lines it prints, not the others).
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Collection, Protocol, TextIO

from scaletrain.contract.files import METRICS_FILE, SUMMARY_FILE, TENSORBOARD_DIR
from scaletrain.errors import UsageError
from scaletrain.extras import install_hint
from scaletrain.observe.config import MonitorConfig
from scaletrain.observe.inputs import check_run_dir
from scaletrain.observe.records import Record, StepBatch, encode


class Sink(Protocol):
    """The interface every sink implements."""

    def write(self, batch: StepBatch) -> None: ...

    def event(self, record: Record) -> None: ...

    def close(self, summary: Record) -> None: ...


def _fmt_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _fmt_rate(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.1f}"


def format_step_line(rec: Record, total: int | None, eta_s: float | None) -> str:
    """One human line for a step record: step, loss, time, throughput, data wait, memory, MFU."""
    parts = [f"step {rec['step']}" + (f"/{total}" if total else "")]
    if rec.get("loss") is not None:
        parts.append(f"loss {rec['loss']:.4g}")
    parts.append(f"{rec['step_s'] * 1000:.1f} ms/step")
    parts.append(f"{_fmt_rate(rec['samples_per_s'])} samples/s")
    if rec.get("tokens_per_s"):
        parts.append(f"{_fmt_rate(rec['tokens_per_s'])} tok/s")
    parts.append(f"data wait {rec['data_wait_frac'] * 100:.0f}%")
    if rec.get("peak_mem_gb") is not None:
        parts.append(f"mem {rec['peak_mem_gb']:.2f} GB")
    if rec.get("mfu") is not None:
        parts.append(f"MFU {rec['mfu'] * 100:.1f}%")
    if eta_s is not None:
        parts.append(f"ETA {_fmt_duration(eta_s)}")
    return " | ".join(parts)


class ConsoleSink:
    """Rank 0's console: a progress bar on a terminal, plain lines elsewhere (a Slurm log).

    A plain line is printed for steps whose number is a multiple of ``every`` and that ended
    at least ``interval_s`` seconds (by the steps' own clock) after the step of the line before,
    as tqdm's ``mininterval`` spaces a batch log; the last step always has its line. The bar
    redraws at most every 0.2 s. A finding is printed when it is found, and not again in the
    summary. ``start_step``: the step a resumed run starts from; the lines show the overall step
    (as ``scaletrain status`` does), the records keep this run's count.
    """

    def __init__(self, *, total: int | None = None, every: int = 10, stream: TextIO | None = None,
                 bar: bool | None = None, interval_s: float = 0.0, start_step: int = 0) -> None:
        self.total = total
        self.start_step = start_step
        self.every = max(1, every)
        self.interval_s = interval_s
        self._line_at: float | None = None  # the end (steps' clock) of the step last printed
        self._shown: set[str] = set()       # the findings printed so far
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.bar = bool(total) and (isatty if bar is None else bar)
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._drawn = False

    def _eta(self, step: int) -> float | None:
        """Seconds left after this run's ``step``-th step, at this run's pace."""
        if not self.total or step <= 0:
            return None
        elapsed = time.monotonic() - self._start
        return elapsed / step * max(0, self.total - self.start_step - step)

    def _overall(self, rec: Record) -> Record:
        return {**rec, "step": rec["step"] + self.start_step} if self.start_step else rec

    def write(self, batch: StepBatch) -> None:
        if not len(batch):
            return
        if self.bar:
            last = batch.record(len(batch) - 1)
            if last.get("loss") is None:  # the Monitor keeps only the losses a sink shows: the newest
                kept = batch.newest_loss()
                if kept is not None:
                    last = {**last, "loss": batch.record(kept)["loss"]}
            now = time.monotonic()
            shown = self._overall(last)
            if now - self._last_draw < 0.2 and shown["step"] != self.total:
                return
            self._last_draw = now
            frac = min(1.0, shown["step"] / self.total) if self.total else 0.0
            width = 24
            filled = int(frac * width)
            bar = "#" * filled + "-" * (width - filled)
            line = f"[{bar}] {frac * 100:3.0f}% " + format_step_line(shown, self.total, self._eta(last["step"]))
            self.stream.write("\r" + line[:200].ljust(120))
            self.stream.flush()
            self._drawn = True
            return
        chosen = self._spaced(batch, list(batch.chosen(self.every)))   # records only for the lines printed
        final = None if self.total is None else self.total - self.start_step - batch.cols.first
        if final is not None and 0 <= final < len(batch):
            chosen = sorted({*chosen, final})   # the last step's line too
        for i in chosen:
            self.stream.write(format_step_line(self._overall(batch.record(i)), self.total,
                                               self._eta(batch.cols.first + i)) + "\n")
        if chosen:
            self.stream.flush()

    def _spaced(self, batch: StepBatch, chosen: list[int]) -> list[int]:
        """Of the ``chosen`` steps, those at least ``interval_s`` after the line before."""
        if self.interval_s <= 0:
            return chosen
        ends, kept = batch.cols.ends, []
        for i in chosen:
            if self._line_at is None or ends[i] - self._line_at >= self.interval_s:
                kept.append(i)
                self._line_at = ends[i]
        return kept

    def event(self, record: Record) -> None:
        if self._drawn:
            self.stream.write("\n")
            self._drawn = False
        text = record.get("message", "")
        self._shown.add(text)
        hint = record.get("hint")
        self.stream.write(f"scaletrain monitor: {text}" + (f"\n  HINT: {hint}" if hint else "") + "\n")
        self.stream.flush()

    def close(self, summary: Record) -> None:
        if self._drawn:
            self.stream.write("\n")
        self.stream.write(format_summary(summary, shown=self._shown) + "\n")
        self.stream.flush()


def format_summary(summary: Record, *, shown: Collection[str] = ()) -> str:
    """The final summary as a few lines (the findings whose message is in ``shown``, printed
    already, left out)."""
    lines = [f"scaletrain monitor: {summary.get('steps', 0)} steps in "
             f"{_fmt_duration(summary.get('wall_s', 0.0))} on {summary.get('world_size', 1)} process(es)"]
    if summary.get("step_s_median") is not None:
        lines.append(f"  step time median {summary['step_s_median'] * 1000:.1f} ms, "
                     f"{_fmt_rate(summary['samples_per_s'])} samples/s global, "
                     f"{_fmt_rate(summary['samples_per_s_per_device'])} per device, "
                     f"data wait {summary['data_wait_frac'] * 100:.0f}%")
    if summary.get("peak_mem_gb") is not None:
        lines.append(f"  peak memory {summary['peak_mem_gb']:.2f} GB ({summary.get('mem_kind', '')})")
    if summary.get("mfu") is not None:
        lines.append(f"  model FLOP utilisation {summary['mfu'] * 100:.1f}%")
    dev = summary.get("device_util")
    if isinstance(dev, dict) and dev.get("available") and dev.get("samples") == 0:
        lines.append(f"  GPU {dev.get('device', '')}: no reading taken while training (a run shorter than "
                     "the sampling interval)")
    elif isinstance(dev, dict) and dev.get("available"):
        parts = [f"{label} {dev[key]:{fmt}}{unit}" for key, label, fmt, unit in (
            ("util_pct", "utilisation", ".0f", "%"), ("mem_gb", "memory", ".1f", " GB"), ("power_w", "power", ".0f", " W"))
            if dev.get(key) is not None]
        lines.append(f"  GPU {dev.get('device', '')}: "
                     + (", ".join(parts) or "no readings"))
    elif isinstance(dev, dict):
        lines.append(f"  GPU sampling unavailable: {dev.get('reason', 'unknown')}")
    for finding in summary.get("findings", []):
        if finding.get("message") in shown:
            continue
        lines.append(f"  {finding.get('kind', 'note')}: {finding.get('message', '')}")
    if summary.get("run_dir") and summary.get("files"):
        lines.append(f"  files in {summary['run_dir']}: {', '.join(summary['files'])}")
    return "\n".join(lines)


class JsonlSink:
    """One JSON object per line in ``path``: ``{"type": "step", ...}`` records and events.

    Lines are appended in batches and each batch is flushed, so a crash loses at most the
    records since the last batch and never leaves half a line that a reader would trip on.
    """

    def __init__(self, path: str | os.PathLike[str], every: int | None = None, start: Record | None = None) -> None:
        self.path = Path(path)
        self.every = every      # a line per every-th step; None: spaced by time (records.spaced_every)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")
        if start is not None:   # one line per run: a requeued job's runs append to one file
            self._emit(encode({"type": "start", **start}) + "\n")

    def _emit(self, text: str) -> None:
        if self._fh.closed or not text:
            return
        self._fh.write(text)  # whole lines only: a batch is one write of complete lines
        self._fh.flush()

    def write(self, batch: StepBatch) -> None:
        self._emit(batch.lines(self.every))

    def event(self, record: Record) -> None:
        self._emit(encode({"type": "event", **record}) + "\n")

    def close(self, summary: Record) -> None:
        self._emit(encode({"type": "summary", **summary}) + "\n")
        self._fh.close()


# step-record fields that become TensorBoard scalars, and their tags
TB_SCALARS = {
    "loss": "train/loss",
    "step_s": "perf/step_time_s",
    "samples_per_s": "perf/samples_per_s",
    "samples_per_s_per_device": "perf/samples_per_s_per_device",
    "tokens_per_s": "perf/tokens_per_s",
    "data_wait_frac": "perf/data_wait_frac",
    "peak_mem_gb": "perf/peak_mem_gb",
    "mfu": "perf/mfu",
}


# numeric step-record fields that are coordinates, not measurements
NOT_SCALARS = {"step", "t", "rank", "world_size", "samples", "tokens", "data_wait_s"}


class TensorBoardSink:
    """TensorBoard event files in ``log_dir`` (needs the ``monitor`` extra: tensorboard).

    Written with torch's ``SummaryWriter``; the files are read by TensorBoard itself. Extra
    numeric fields given to ``Monitor.step(**extra)`` become ``extra/<name>`` scalars.
    """

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UsageError("TensorBoard logging needs the tensorboard package",
                             f"{install_hint('monitor', 'tensorboard')}, or pass tensorboard=False") from None
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, batch: StepBatch) -> None:
        for rec in batch.records():
            step = rec["step"]
            for key, value in rec.items():
                if not isinstance(value, (int, float)) or isinstance(value, bool) or key in ("step", "t"):
                    continue
                if key in NOT_SCALARS:
                    continue
                tag = TB_SCALARS.get(key, f"extra/{key}")
                if math.isfinite(float(value)):
                    self._writer.add_scalar(tag, float(value), step)
        self._writer.flush()

    def event(self, record: Record) -> None:
        self._writer.add_text("monitor/events", str(record.get("message", "")), record.get("step", 0))

    def close(self, summary: Record) -> None:
        self._writer.add_text("monitor/summary", format_summary(summary).replace("\n", "  \n"))
        self._writer.flush()
        self._writer.close()


def start_record(*, total_steps: int | None, start_step: int, world_size: int, device: str,
                 host: str) -> Record:
    """A run's first JSONL line: what ``status`` and ``report`` need to place its steps."""
    restart = os.environ.get("SLURM_RESTART_COUNT", "0").strip()
    return {"time": time.time(), "total_steps": total_steps, "start_step": int(start_step),
            "world_size": world_size, "device": device, "host": host,
            "job_id": os.environ.get("SLURM_JOB_ID"), "restart": int(restart) if restart.isdigit() else 0}


def build_sinks(run_dir: Path | None, config: MonitorConfig, *, rank: int, start: Record) -> list[Sink]:
    """The sinks a Monitor writes to: rank 0's console, and in ``run_dir`` its JSONL file and
    TensorBoard events; none on the other ranks (which still fail alike without tensorboard)."""
    sinks: list[Sink] = []
    if rank == 0:
        if config.console:
            sinks.append(ConsoleSink(total=config.total_steps, every=config.log_every, stream=config.stream,
                                     interval_s=config.log_interval_s,
                                     start_step=int(start.get("start_step", 0))))
        if run_dir is not None:
            check_run_dir(run_dir)
            if config.jsonl:
                sinks.append(JsonlSink(run_dir / METRICS_FILE, every=config.jsonl_every, start=start))
            if config.tensorboard:
                sinks.append(TensorBoardSink(run_dir / TENSORBOARD_DIR))
    elif config.tensorboard:  # same error on every rank when the extra is missing
        try:
            import tensorboard as _tb  # noqa: F401
        except ImportError:
            TensorBoardSink("/nonexistent")  # raises the UsageError with the hint
    return sinks


def run_files(run_dir: Path | None, sinks: list[Sink]) -> Record:
    """The run folder and what the sinks write there (for the summary's last line)."""
    names = [name for sink, name in ((JsonlSink, METRICS_FILE), (TensorBoardSink, f"{TENSORBOARD_DIR}/"))
             if any(isinstance(s, sink) for s in sinks)]
    return {"run_dir": str(run_dir), "files": [*names, SUMMARY_FILE]}
