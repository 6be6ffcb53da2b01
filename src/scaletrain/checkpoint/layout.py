"""The checkpoint folder on disk: names, the commit marker, "latest", retention, clean-up.

Pure file-system logic, no torch: every rule about which folder counts lives here, so the
writer, the loader and the tests share one answer.

- ``step-00001200/`` is a committed checkpoint only when ``step-00001200/COMMIT.json`` exists,
  parses, names step 1200 and lists files that are all there with their sizes. The marker is
  the last thing a save writes (atomically: temporary file, fsync, rename).
- A save writes into ``.partial-step-00001200-<token>/`` and renames it once every rank's
  files are fsynced; a folder that a kill left behind keeps its ``.partial-`` name (or has
  no marker) and is ignored by every reader.
- Latest = the committed folder with the highest step whose listed files are all there with
  their sizes (no symlink that could dangle). :func:`choose` is that rule, the only one:
  ``status``, ``report``, ``cancel`` and the resume (``reader``) all call it, so they name the
  same checkpoint. A step that goes backwards (step 110 saved while step 300 is on disk: a run
  that started over in the same folder) is recorded in the new marker and warned about, at the
  save and by every reader, because the resume still loads the higher step.
- Retention keeps the newest ``keep`` committed folders and never touches the folder just
  committed nor the newest valid one. A folder is deleted marker first, so a kill half-way
  through a deletion leaves an uncommitted folder, never a committed partial one.
- Clean-up of partial folders skips any folder whose writer is alive: the writer holds an
  ``flock`` on ``<folder>/.lock`` for the whole save, and records its host and PID.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import socket
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.checkpoint import marker
from scaletrain.checkpoint.marker import MARKER
from scaletrain.contract.files import STEP_DIR_PREFIX
from scaletrain.errors import UsageError
from scaletrain.fileio import atomic_write, fsync_dir, json_text

LOCK = ".lock"
OWNER = ".owner.json"
FORMAT = marker.CHECKSUMS_SINCE  # version of the folder layout; a reader refuses newer ones
# (2: every listed file has its checksum; 1: checksums optional, as before they existed)

_STEP_DIR = re.compile(rf"^{STEP_DIR_PREFIX}(\d{{8,}})$")
_PARTIAL_DIR = re.compile(rf"^\.partial-{STEP_DIR_PREFIX}(\d{{8,}})-[0-9a-f]+$")
# a committed folder moved aside while the same step is saved again (see commit())
_REPLACED_DIR = re.compile(rf"^\.replaced-{STEP_DIR_PREFIX}(\d{{8,}})-[0-9a-f]+$")


def step_dirname(step: int) -> str:
    """``step-00001200``: zero-padded so names sort like steps in a file browser."""
    return f"{STEP_DIR_PREFIX}{step:08d}"


def partial_dirname(step: int, token: str | None = None) -> str:
    """A fresh temporary name for a save of ``step`` in progress."""
    return f".partial-{step_dirname(step)}-{token or secrets.token_hex(4)}"


@dataclass(frozen=True, kw_only=True)
class Committed:
    """One committed checkpoint folder and its marker's content."""

    step: int
    path: Path
    marker: dict[str, Any] = field(compare=False)


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The folder's commit marker, or None when it is missing or not valid (see
    :mod:`scaletrain.checkpoint.marker`)."""
    data = marker.load(folder)
    return data if isinstance(data, dict) and marker.problem(data) is None else None


def verify_files(folder: Path, data: dict[str, Any]) -> str | None:
    """First problem with the files a valid marker lists, or None (``marker.verify_files``)."""
    return marker.verify_files(folder, data)


def damaged(directory: Path) -> list[tuple[int, Path, str]]:
    """``step-N`` folders whose marker exists but is not valid: ``(step, folder, why)``.

    A folder without a marker is an interrupted save, not listed.
    """
    out = []
    for name in _listdir(directory):
        match = _STEP_DIR.match(name)
        path = directory / name
        if match is None or path.is_symlink() or not path.is_dir():
            continue
        data = marker.load(path)
        if data == marker.MISSING:
            continue
        why = marker.load_problem(data) or marker.problem(data)
        if why is None and data["step"] != int(match.group(1)):
            why = f"it names step {data['step']}"
        if why is not None:
            out.append((int(match.group(1)), path, f"{MARKER}: {why}"))
    return sorted(out)


def set_aside(folder: Path) -> Path | None:
    """Rename a damaged checkpoint folder to ``damaged-step-N-<token>`` (kept for inspection,
    ignored by loads and retention); the new path, or None if it could not be renamed."""
    target = folder.parent / f"damaged-{folder.name}-{secrets.token_hex(4)}"
    try:
        os.replace(folder, target)
    except OSError:
        return None
    fsync_dir(folder.parent)
    return target


def committed(directory: Path) -> list[Committed]:
    """Every committed checkpoint in ``directory``, oldest step first.

    A folder counts when its marker exists and names the folder's own step. A folder moved
    aside by a re-save of the same step counts only when no committed folder has that step
    (a kill in the middle of the swap leaves it as the valid copy).
    """
    found: dict[int, Committed] = {}
    replaced: dict[int, Committed] = {}
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        match = _STEP_DIR.match(entry.name) or _REPLACED_DIR.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        step = int(match.group(1))
        marker = read_marker(Path(entry.path))
        if marker is None or marker["step"] != step:
            continue
        item = Committed(step=step, path=Path(entry.path), marker=marker)
        (found if entry.name.startswith(STEP_DIR_PREFIX) else replaced)[step] = item
    for step, item in replaced.items():
        found.setdefault(step, item)
    return [found[s] for s in sorted(found)]


def latest(directory: Path) -> Committed | None:
    """The committed checkpoint with the highest step (files not checked), or None."""
    items = committed(directory)
    return items[-1] if items else None


SAVED_AFTER = "saved_after_step"  # marker field: the higher step on disk when this one was saved


@dataclass(frozen=True, kw_only=True)
class Choice:
    """What "the latest checkpoint" of a folder is (:func:`choose`), and what was passed over."""

    item: Committed | None
    skipped: tuple[tuple[Path, str], ...] = ()   # newer committed folders whose files are not intact
    backwards: tuple[tuple[int, int], ...] = ()  # (step, the higher step on disk when it was saved)

    @property
    def step(self) -> int | None:
        """The chosen step, or None (no intact committed checkpoint)."""
        return self.item.step if self.item is not None else None

    def notes(self) -> list[str]:
        """One line per thing a user should know about the choice (damage, a step gone back)."""
        return [f"checkpoint {path.name} is damaged ({why}): passed over"
                for path, why in self.skipped] + self.backwards_notes()

    def backwards_notes(self) -> list[str]:
        """One line per lower step saved after a higher one that the resume still prefers."""
        return [f"checkpoint step {step} was saved after step {after} (the step went backwards: "
                f"a run started over in this folder?); a resume loads the highest step, "
                f"{self.item.step}; use a new checkpoint folder per run"
                for step, after in self.backwards if self.item is not None and self.item.step > step]


def candidates(directory: Path) -> list[Committed]:
    """Committed checkpoints in the order a resume tries them: the highest step first."""
    return committed(directory)[::-1]


def choose(directory: Path, *, skip: AbstractSet[Path] = frozenset()) -> Choice:
    """THE rule for "the latest checkpoint": the highest committed step whose listed files are
    all there with their sizes, ``skip`` (folders found damaged otherwise) passed over.

    Checksums are not read here (that is the loading ranks' work, on data they read anyway):
    a checkpoint whose bytes changed but not its sizes is found by the resume, which sets it
    aside as ``damaged-*``, and from then on every caller of this rule agrees again.
    """
    skipped: list[tuple[Path, str]] = []
    chosen = None
    items = candidates(directory)
    for item in items:
        why = "found damaged" if item.path in skip else verify_files(item.path, item.marker)
        if why is None:
            chosen = item
            break
        skipped.append((item.path, why))
    backwards = tuple(sorted((i.step, i.marker[SAVED_AFTER]) for i in items
                             if _count(i.marker.get(SAVED_AFTER)) and i.marker[SAVED_AFTER] > i.step))
    return Choice(item=chosen, skipped=tuple(skipped), backwards=backwards)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def to_delete(steps: list[int], keep: int, protect: set[int]) -> list[int]:
    """Steps to delete so that the newest ``keep`` remain; ``protect`` is never deleted.

    Pure: ``steps`` are committed steps. The newest step is always kept (it is the last
    valid checkpoint), whatever ``keep`` says.
    """
    if keep < 1:
        raise ValueError("keep must be >= 1")
    ordered = sorted(set(steps))
    if not ordered:
        return []
    kept = set(ordered[-keep:]) | {ordered[-1]} | protect
    return [s for s in ordered if s not in kept]


def remove_committed(item: Committed) -> None:
    """Delete a committed folder: marker first (then it no longer counts), then the rest."""
    try:
        (item.path / MARKER).unlink()
    except FileNotFoundError:
        pass
    fsync_dir(item.path)
    shutil.rmtree(item.path, ignore_errors=True)


def apply_retention(directory: Path, keep: int, protect: set[int]) -> list[int]:
    """Delete committed folders beyond the newest ``keep``; returns the steps deleted."""
    items = committed(directory)
    by_step = {item.step: item for item in items}
    doomed = to_delete(list(by_step), keep, protect)
    for step in doomed:
        remove_committed(by_step[step])
    # a stale moved-aside copy whose step has a committed folder again is garbage
    for entry in _listdir(directory):
        match = _REPLACED_DIR.match(entry)
        if match and int(match.group(1)) in by_step and \
                by_step[int(match.group(1))].path.name != entry:
            _remove_if_abandoned(directory / entry)
    return doomed


# -- writing ----------------------------------------------------------------------------


class PartialFolder:
    """A checkpoint being written: a ``.partial-`` folder locked by its writer.

    Created by the process that commits (rank 0); other ranks only write files into it.
    """

    def __init__(self, directory: Path, step: int, name: str | None = None) -> None:
        self.directory = directory
        self.step = step
        self.path = directory / (name or partial_dirname(step))
        self._lock_fd: int | None = None

    def create(self) -> None:
        """Make the folder, take its lock and record the owner (host, PID, time)."""
        self.path.mkdir(parents=False, exist_ok=False)
        self._lock_fd = os.open(self.path / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # advisory (read by clean-up only), so no fsync: a lost owner file after a power
        # cut just means the folder is treated as abandoned, which it then is
        (self.path / OWNER).write_text(json_text(
            {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}))

    def release(self) -> None:
        """Drop the lock (after commit, or when giving up)."""
        if self._lock_fd is not None:
            try:
                os.close(self._lock_fd)
            finally:
                self._lock_fd = None

    def commit(self, marker: dict[str, Any]) -> Path:
        """Rename to ``step-N`` and write the marker last; returns the committed path.

        A committed folder of the same step (a re-save) is first moved aside under a
        ``.replaced-`` name that readers still accept, and deleted only after the new marker
        is on disk, so a valid copy of the step exists at every moment.
        """
        final = self.directory / step_dirname(self.step)
        aside: Path | None = None
        marker = self._note_backwards(marker)
        for name in (LOCK, OWNER):
            try:
                (self.path / name).unlink()
            except FileNotFoundError:
                pass
        try:
            if final.exists():
                aside = self.directory / \
                    f".replaced-{step_dirname(self.step)}-{secrets.token_hex(4)}"
                os.replace(final, aside)
            os.replace(self.path, final)
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                raise
            # the folder appeared (or went) between our check and our rename: another writer
            raise _two_writers(self.directory, f"it committed {final.name} at the same "
                                               "moment") from None
        # The marker (fsynced with its folder by atomic_write), then the parent folder, which
        # makes the rename durable. A power cut before that leaves the marker inside a folder
        # still named .partial-: ignored, as it should be.
        atomic_write(final / MARKER, json_text(marker, indent=1, sort_keys=True) + "\n")
        fsync_dir(self.directory)
        self.release()
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        self.path = final
        return final

    def _note_backwards(self, marker: dict[str, Any]) -> dict[str, Any]:
        """Record and warn when a higher step is already committed: a resume would load it,
        not this one (see :class:`Choice`)."""
        higher = latest(self.directory)
        if higher is None or higher.step <= self.step:
            return marker
        warnings.warn(f"checkpoint step {self.step} saved in {self.directory}, which already holds "
                      f"step {higher.step}: the step went backwards, and a resume loads the highest "
                      f"step ({higher.step}), not this one; use a new checkpoint folder per run, or "
                      "move the old steps aside", stacklevel=2)
        return {**marker, SAVED_AFTER: higher.step}

    def abandon(self) -> None:
        """Remove the folder after a failed save (best effort)."""
        self.release()
        shutil.rmtree(self.path, ignore_errors=True)


def clean_partials(directory: Path, *, exclude: AbstractSet[str] = frozenset()) -> list[str]:
    """Remove ``.partial-`` folders whose writer is gone; returns their names.

    A folder is left alone when its lock is held (a live save, here or on another node
    where the file system honours flock), or when its owner is a live process on this host.
    """
    removed = []
    for name in _listdir(directory):
        if name in exclude or not _PARTIAL_DIR.match(name):
            continue
        if _remove_if_abandoned(directory / name):
            removed.append(name)
    return removed


def busy_partials(directory: Path, *, exclude: AbstractSet[str] = frozenset()) -> list[str]:
    """``.partial-`` folders whose writer is alive (its lock is held): another save in
    progress. Call after :func:`clean_partials`."""
    return sorted(name for name in _listdir(directory)
                  if name not in exclude and _PARTIAL_DIR.match(name)
                  and not _remove_if_abandoned(directory / name))


def _two_writers(directory: Path, detail: str) -> Exception:
    from scaletrain.checkpoint.errors import CheckpointError

    return CheckpointError(
        f"another job or process is saving checkpoints into {directory} ({detail}); two "
        "writers in one checkpoint directory would replace and delete each other's steps",
        hint="give each job its own checkpoint directory (e.g. one per run or per job ID)")


def check_single_writer(directory: Path, *, exclude: AbstractSet[str] = frozenset()) -> None:
    """CheckpointError when a live save of another process is in ``directory``."""
    busy = busy_partials(directory, exclude=exclude)
    if busy:
        raise _two_writers(directory, f"its save {busy[0]} is in progress")


def _remove_if_abandoned(path: Path) -> bool:
    lock = path / LOCK
    fd: int | None = None
    try:
        if lock.exists():
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    return False  # a live writer holds it
                raise
        if _owner_alive(path):
            return False
        shutil.rmtree(path, ignore_errors=True)
        return not path.exists()
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def _owner_alive(path: Path) -> bool:
    try:
        owner = json.loads((path / OWNER).read_text(encoding="utf-8"))
        host, pid = owner["host"], int(owner["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if host != socket.gethostname() or pid == os.getpid():
        # our own PID: this process is not saving it now (the save would exclude it)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _listdir(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def check_directory(directory: Path) -> None:
    """Create ``directory`` if needed and make sure this process can write into it."""
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"checkpoint directory {directory} is not a directory",
                         hint="pass a folder path, not a file")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(
            f"cannot create the checkpoint directory {directory}: {err.strerror or err}",
            hint="pass a directory on a writable file system (e.g. your project's scratch)")
    if not directory.is_dir():
        raise UsageError(f"checkpoint directory {directory} is not a directory",
                         hint="pass a folder path, not a file")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"checkpoint directory {directory} is not writable",
                         hint="pass a directory you can write to, or fix its permissions")
