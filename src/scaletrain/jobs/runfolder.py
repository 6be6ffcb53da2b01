"""Reading a run folder, never writing it: the job id, the output files, the Monitor's and the
Checkpointer's records.

A run folder is what :mod:`scaletrain.slurm.submit` made (``job.sh``, ``job_id``, the job's
``*.out``). The training program chooses where its Monitor and Checkpointer write; the
after-submit verbs look for them in the run folder itself and in its sub-folders two levels
down (``runs/x/metrics.jsonl``, ``runs/x/monitor/metrics.jsonl``, ``runs/x/out/checkpoints/``),
so a program given the run folder as its output folder is found without configuration. A
Monitor folder on its own (no job) is a run folder too, for ``scaletrain report``.

Everything here is read-only and tolerant: a folder deleted or edited by hand, a file that is
not what its writer writes gives a note, never an exception (``status`` over 200 folders must not
stop at one broken one). This module finds the files; each is read by its writer's reader
(``metrics.jsonl``: :mod:`scaletrain.observe.monitorfiles`; ``stop.json``:
:mod:`scaletrain.checkpoint.stoprecord`; ``job_id``: :mod:`scaletrain.slurm.submit`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.checkpoint.layout import Choice, choose
from scaletrain.checkpoint.stoprecord import has_stop_record, read_stop_record
from scaletrain.contract.files import (COMMIT_MARKER, JOB_ID_FILE, JOB_SCRIPT, METRICS_FILE, RUNS_DIR, STEP_DIR_PREFIX,
                                       TENSORBOARD_DIR)
from scaletrain.slurm.submit import read_job_id

SEARCH_DEPTH = 2                 # sub-folder levels searched for the Monitor's and Checkpointer's files
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
        elif run.metrics is None and os.path.lexists(folder / METRICS_FILE):   # a pipe, a folder, a link
            run.notes.append(f"{folder / METRICS_FILE} is not a regular file: left unread")
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


def latest_checkpoint(folder: Path | None) -> int | None:
    """The step a resume loads (:func:`scaletrain.checkpoint.layout.choose`), or None."""
    return checkpoint_choice(folder).step


def checkpoint_choice(folder: Path | None, *, verify_bytes: int | None = None) -> Choice:
    """The checkpoint folder's latest checkpoint by the one rule the resume uses, with its notes
    (damaged newer ones, a step that went backwards); an unreadable folder is an empty choice.
    ``verify_bytes``: how much of it may be read to check checksums (``layout.choose``)."""
    if folder is None:
        return Choice(item=None)
    try:
        return choose(folder, verify_bytes=verify_bytes)
    except (OSError, ValueError):
        return Choice(item=None)


def stop_record(folder: Path | None) -> dict[str, Any] | None:
    """The Checkpointer's ``stop.json`` (why the job stopped on purpose, at which step), its
    fields of the types the verbs show (:func:`scaletrain.checkpoint.stoprecord.read_stop_record`)."""
    return read_stop_record(folder)
