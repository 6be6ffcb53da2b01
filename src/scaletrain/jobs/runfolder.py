"""Reading a run folder, never writing it: the job id, the output files, the Monitor's and the
Checkpointer's records.

A run folder is what :mod:`scaletrain.slurm.submit` made (``job.sh``, ``job_id``, the job's
``*.out``). The training program chooses where its Monitor and Checkpointer write; the
after-submit verbs look for them in the run folder itself and in its sub-folders two levels
down (``runs/x/metrics.jsonl``, ``runs/x/monitor/metrics.jsonl``, ``runs/x/out/checkpoints/``),
so a program given the run folder as its output folder is found without configuration. A
Monitor folder on its own (no job) is a run folder too, for ``scaletrain report``.

Everything here is read-only and tolerant: a folder deleted or edited by hand, a truncated
line, a file that is not JSON gives a note, never an exception (``status`` over 200 folders
must not stop at one broken one). Only the tail of ``metrics.jsonl`` is read for ``status``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from scaletrain.checkpoint.layout import Choice, choose
from scaletrain.checkpoint.stoprecord import has_stop_record, read_stop_record
from scaletrain.contract.files import (COMMIT_MARKER, JOB_ID_FILE, JOB_SCRIPT, METRICS_FILE, RUNS_DIR, STEP_DIR_PREFIX,
                                       TENSORBOARD_DIR)
from scaletrain.fileio import json_text, open_regular, read_json_object
from scaletrain.slurm.submit import read_job_id
SEARCH_DEPTH = 2                 # sub-folder levels searched for the Monitor's and Checkpointer's files
TAIL_BYTES = 256 * 1024          # what status reads of metrics.jsonl at first: the last steps and the run's start
SCAN_BYTES = 1024 * 1024 * 1024  # how far back it looks for the run's start line in a long run, 1 MiB at a time
LINE_BYTES = 1024 * 1024         # a record longer than this is not the Monitor's: skipped
MAX_LOG_FILES = 1000             # output files listed (array jobs); the newest are kept, the rest named in a note


@dataclass(kw_only=True)
class RunFolder:
    """What a run folder holds, as far as it could be read (``notes`` says what could not)."""

    path: Path
    job_id: str | None = None
    script: Path | None = None
    logs: list[Path] = field(default_factory=list)
    metrics: Path | None = None          # the Monitor's metrics.jsonl
    checkpoints: Path | None = None      # the Checkpointer's folder (step-*/COMMIT.json)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The folder's name, as status lists it."""
        return self.path.name


def is_dir(path: Path) -> bool:
    """``path.is_dir()`` that answers False, not OSError, for a name the file system refuses."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def default_runs(base: Path = Path(RUNS_DIR)) -> list[Path]:
    """The run folders under ``./runs``, newest first (by the time their job was submitted)."""
    try:
        found = [p for p in base.iterdir() if is_dir(p) and not p.name.startswith(".")]
    except OSError:
        return []

    def when(p: Path) -> float:
        for name in (JOB_ID_FILE, JOB_SCRIPT):
            try:
                return (p / name).stat().st_mtime
            except OSError:
                continue
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    return sorted(found, key=when, reverse=True)


def walk(root: Path, depth: int) -> list[Path]:
    """``root`` and its sub-folders down to ``depth`` levels (hidden and step-* folders skipped)."""
    out, level = [root], [root]
    for _ in range(depth):
        nxt = []
        for folder in level:
            try:
                with os.scandir(folder) as it:
                    nxt += [Path(e.path) for e in it if e.is_dir(follow_symlinks=False)
                            and not e.name.startswith((".", STEP_DIR_PREFIX, TENSORBOARD_DIR))]
            except OSError:
                continue
        out += sorted(nxt)
        level = nxt
    return out


def open_run(path: str | Path) -> RunFolder:
    """Read what ``path`` holds; a missing or unreadable folder is a RunFolder with a note."""
    run = RunFolder(path=Path(path))
    if not is_dir(run.path):
        run.notes.append("folder not found (moved or deleted?)")
        return run
    run.job_id, note = read_job_id(run.path)     # the writer's own reader (slurm.submit)
    if note:
        run.notes.append(note)
    if _is_file(run.path / JOB_SCRIPT):
        run.script = run.path / JOB_SCRIPT
    try:
        logs = sorted(run.path.glob("*.out"), key=lambda p: (_mtime(p), p.name))
    except OSError:
        logs = []
    run.logs = logs[-MAX_LOG_FILES:]
    if len(logs) > MAX_LOG_FILES:
        run.notes.append(f"{len(logs) - MAX_LOG_FILES} older output files left out ({logs[0].name} to "
                         f"{logs[-MAX_LOG_FILES - 1].name}); the newest {MAX_LOG_FILES} are read")
    for folder in walk(run.path, SEARCH_DEPTH):
        if run.metrics is None and _is_file(folder / METRICS_FILE):
            run.metrics = folder / METRICS_FILE
        if run.checkpoints is None and _has_checkpoints(folder):
            run.checkpoints = folder
    return run


def _is_file(path: Path) -> bool:
    """``path.is_file()`` that answers False, not OSError, for a path the file system refuses."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _has_checkpoints(folder: Path) -> bool:
    if has_stop_record(folder):
        return True
    try:
        return any(folder.glob(f"{STEP_DIR_PREFIX}*/{COMMIT_MARKER}"))
    except OSError:
        return False


def read_json(path: Path) -> dict[str, Any] | None:
    """A small JSON object, or None when missing, unreadable or not an object (stray bytes replaced)."""
    return read_json_object(path, errors="replace")


def latest_checkpoint(folder: Path | None) -> int | None:
    """The step a resume loads (:func:`scaletrain.checkpoint.layout.choose`), or None."""
    return checkpoint_choice(folder).step


def checkpoint_choice(folder: Path | None) -> Choice:
    """The checkpoint folder's latest checkpoint by the one rule the resume uses, with its notes
    (damaged newer ones, a step that went backwards); an unreadable folder is an empty choice."""
    if folder is None:
        return Choice(item=None)
    try:
        return choose(folder)
    except (OSError, ValueError):
        return Choice(item=None)


def marker_step(marker: dict[str, Any] | None) -> int | None:
    """The step a ``COMMIT.json`` names, or None when it names none (a hand-edited marker)."""
    step = marker.get("step") if marker is not None else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def stop_record(folder: Path | None) -> dict[str, Any] | None:
    """The Checkpointer's ``stop.json`` (why the job stopped on purpose, at which step), its
    fields of the types the verbs show (:func:`scaletrain.checkpoint.stoprecord.read_stop_record`)."""
    return read_stop_record(folder)


# The Monitor's fields that the after-submit verbs compute with, and what each must be. A
# hand-edited value of another type is dropped (the figure is then unknown), never computed with.
_COUNTS = ("step", "start_step", "total_steps", "samples")
_NUMBERS = ("t", "step_s", "samples_per_s", "loss", "time")
_POSITIVE = ("step_s", "samples_per_s", "total_steps")


def clean_record(value: Any) -> dict[str, Any] | None:
    """One metrics.jsonl record with every field we compute with of the right type, or None.

    A ``step`` record without a whole step number and a time is not the Monitor's: skipped.
    """
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        return None
    rec = dict(value)
    for key in _COUNTS:
        v = rec.get(key)
        if key in rec and (isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 10**15):
            del rec[key]
    for key in _NUMBERS:
        v = rec.get(key)
        if key in rec and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                           or abs(v) > 1e15):
            del rec[key]
    for key in _POSITIVE:
        if key in rec and rec[key] <= 0:
            del rec[key]
    for key in ("message", "hint", "reason"):
        if key in rec and not isinstance(rec[key], str):
            rec[key] = json_text(rec[key], default=str)[:500]
    if "device_util" in rec and not isinstance(rec["device_util"], dict):
        del rec["device_util"]
    if rec["type"] == "step" and ("step" not in rec or "t" not in rec):
        return None
    return rec


def as_object(value: Any) -> dict[str, Any] | None:
    """``value`` if it is a JSON object, else None (for JSONL files other than the Monitor's)."""
    return value if isinstance(value, dict) else None


def _parse(raw: bytes, clean: Callable[[Any], dict[str, Any] | None] = clean_record) -> dict[str, Any] | None:
    try:
        return clean(json.loads(raw))
    except (ValueError, RecursionError):
        return None           # a half-written or hand-edited line: skipped


def _last(fh: IO[bytes], needle: bytes, end: int, *, floor: int = 0) -> int:
    """Offset of the last ``needle`` that starts before ``end`` (not below ``floor``), or -1:
    read backwards a MiB at a time, so memory stays bounded however long the file."""
    chunk, pos = 1 << 20, end
    while pos > floor:
        lo = max(floor, pos - chunk)
        fh.seek(lo)
        found = fh.read(pos - lo + len(needle) - 1).rfind(needle)
        if found >= 0 and lo + found < end:
            return lo + found
        pos = lo
    return -1


def _record_at(fh: IO[bytes], offset: int) -> dict[str, Any] | None:
    if offset < 0:
        return None
    fh.seek(offset)
    return _parse(fh.readline(LINE_BYTES))


def metrics_tail(path: Path | None, limit: int = SCAN_BYTES) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the last run's ``start`` line, its last ``step`` line) from the end of metrics.jsonl.

    Both are found reading backwards from the end (at most ``limit`` bytes, a MiB at a time); only
    those two lines are parsed, so 200 folders cost milliseconds each. A pipe or device in the
    folder's place is refused, not waited on.
    """
    if path is None:
        return None, None
    try:
        with open_regular(path) as fh:
            size = fh.seek(0, os.SEEK_END)
            floor = max(0, size - limit)
            at_step = _last(fh, b'{"type": "step"', size, floor=floor)
            at_start = _last(fh, b'{"type": "start"', size, floor=floor)
            start = _record_at(fh, at_start)
            last = _record_at(fh, at_step) if at_step > at_start else None   # no step yet in a new run
    except OSError:
        return None, None
    return start, last


def iter_records(path: Path, clean: Callable[[Any], dict[str, Any] | None] = clean_record) -> Iterator[dict[str, Any]]:
    """Every usable record of a JSONL file, streamed (a line over LINE_BYTES is skipped whole),
    each passed through ``clean`` (default: the Monitor's record types checked).
    ``OSError`` when it cannot be opened or is not a regular file."""
    with open_regular(path) as fh:
        while True:
            raw = fh.readline(LINE_BYTES)
            if not raw:
                return
            if len(raw) == LINE_BYTES and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):      # the rest of an overlong line
                    raw = fh.readline(LINE_BYTES)
                continue
            rec = _parse(raw, clean)
            if rec is not None:
                yield rec

