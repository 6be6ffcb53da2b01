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
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.checkpoint.stoprecord import has_stop_record, read_stop_record
from scaletrain.contract import (COMMIT_MARKER, JOB_ID_FILE, JOB_SCRIPT, METRICS_FILE, RUNS_DIR, STEP_DIR_PREFIX,
                                 TENSORBOARD_DIR)
from scaletrain.fileio import read_json_object

SEARCH_DEPTH = 2                 # sub-folder levels searched for the Monitor's and Checkpointer's files
TAIL_BYTES = 256 * 1024          # what status reads of metrics.jsonl: the last steps and the run's start
MAX_LOG_FILES = 64


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
        found = [p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")]
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
    try:
        text = (run.path / JOB_ID_FILE).read_text(errors="replace").strip()
        if text.isdigit():
            run.job_id = text
        elif text:
            run.notes.append(f"{JOB_ID_FILE} does not hold a job id ({text[:20]!r})")
    except FileNotFoundError:
        pass
    except OSError as exc:
        run.notes.append(f"cannot read {JOB_ID_FILE}: {exc.strerror}")
    try:
        if (run.path / JOB_SCRIPT).is_file():
            run.script = run.path / JOB_SCRIPT
    except OSError:
        pass
    try:
        run.logs = sorted(run.path.glob("*.out"), key=_mtime)[:MAX_LOG_FILES]
    except OSError:
        pass
    for folder in walk(run.path, SEARCH_DEPTH):
        if run.metrics is None and (folder / METRICS_FILE).is_file():
            run.metrics = folder / METRICS_FILE
        if run.checkpoints is None and _has_checkpoints(folder):
            run.checkpoints = folder
    return run


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
    """The highest step whose folder has a parseable ``COMMIT.json`` naming that step."""
    if folder is None:
        return None
    best = None
    try:
        names = [p.name for p in folder.iterdir() if p.name.startswith(STEP_DIR_PREFIX)]
    except OSError:
        return None
    for name in names:
        digits = name[len(STEP_DIR_PREFIX):]
        if not digits.isdigit() or (best is not None and int(digits) <= best):
            continue
        marker = read_json(folder / name / COMMIT_MARKER)
        if marker is not None and int(marker.get("step", -1)) == int(digits):
            best = int(digits)
    return best


def stop_record(folder: Path | None) -> dict[str, Any] | None:
    """The Checkpointer's ``stop.json`` (why the job stopped on purpose, at which step)."""
    return read_stop_record(folder)


def _lines(data: bytes) -> list[dict[str, Any]]:
    out = []
    for raw in data.splitlines():
        try:
            value = json.loads(raw)
        except ValueError:
            continue          # a half-written or hand-edited line: skipped
        if isinstance(value, dict):
            out.append(value)
    return out


def metrics_tail(path: Path | None, limit: int = TAIL_BYTES) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the last run's ``start`` line, its last ``step`` line) from the end of metrics.jsonl.

    Reads 8 KiB from the end, then 8x more until the run's start line is in view (at most
    ``limit`` bytes); only those two lines are parsed, so 200 folders cost milliseconds each.
    """
    if path is None:
        return None, None
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            span = 8192
            while True:
                fh.seek(max(0, size - span))
                data = fh.read()
                at_start = data.rfind(b'{"type": "start"')
                if at_start >= 0 or span >= min(size, limit):
                    break
                span *= 8
    except OSError:
        return None, None
    at_step = data.rfind(b'{"type": "step"')
    last = _line_at(data, at_step) if at_step > at_start else None   # no step yet in a new run
    return (_line_at(data, at_start) if at_start >= 0 else None), last


def _line_at(data: bytes, pos: int) -> dict[str, Any] | None:
    if pos < 0:
        return None
    end = data.find(b"\n", pos)
    return _one(data[pos:end if end >= 0 else len(data)])


def _one(raw: bytes) -> dict[str, Any] | None:
    found = _lines(raw)
    return found[0] if found else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every record of metrics.jsonl (for the report), unreadable lines skipped."""
    try:
        return _lines(path.read_bytes())
    except OSError:
        return []
