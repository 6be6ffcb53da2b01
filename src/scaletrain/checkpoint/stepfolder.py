"""A step folder's life on the writer's side: made, locked, committed, pruned, cleaned up.

What counts as a committed checkpoint, and which one is "the latest", is the readers' rule
(:mod:`scaletrain.checkpoint.layout`); this module writes folders that rule accepts.

- A save writes into ``.partial-step-00001200-<token>/`` (:class:`PartialFolder`), locked by its
  writer, and :meth:`PartialFolder.commit` renames it to ``step-00001200`` and writes the commit
  marker last (atomically: temporary file, fsync, rename).
- Retention keeps the newest ``keep`` committed folders and never touches the folder just
  committed nor the newest valid one. A folder is deleted marker first, so a kill half-way
  through a deletion leaves an uncommitted folder, never a committed partial one; the next
  pass removes such a ``step-N`` folder without a marker (:func:`clean_uncommitted`), as it
  removes one that a save killed between its rename and its marker left.
- Clean-up skips any folder whose writer is alive: the writer holds an ``flock`` on
  ``<folder>/.lock`` for the whole save, its commit included (the lock goes after the marker),
  and records its host and PID; a folder without either, younger than :data:`GRACE_S`, is
  being created. Only folders holding nothing but the files a save writes are removed.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import errno
import fcntl
import os
import secrets
import shutil
import socket
import time
import warnings
from pathlib import Path
from typing import Any

from scaletrain.checkpoint import layout, marker
from scaletrain.checkpoint.layout import CREATING_DIR, PARTIAL_DIR, REPLACED_DIR, STEP_DIR, names_in
from scaletrain.checkpoint.marker import MARKER
from scaletrain.errors import UsageError
from scaletrain.fileio import atomic_write, fsync_dir, json_text, read_json

LOCK, OWNER = marker.WRITER_FILES
# a folder with neither lock nor owner record, younger than this, is one a writer is creating
# (between its mkdir and its lock) or an older scaletrain committing: left for the next pass
GRACE_S = 120.0


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


def remove_committed(item: layout.Committed) -> None:
    """Delete a committed folder: marker first (then it no longer counts), then the rest."""
    try:
        (item.path / MARKER).unlink()
    except FileNotFoundError:
        pass
    fsync_dir(item.path)
    shutil.rmtree(item.path, ignore_errors=True)


def apply_retention(directory: Path, keep: int, protect: set[int]) -> list[int]:
    """Delete committed folders beyond the newest ``keep``; returns the steps deleted."""
    items = layout.committed(directory)
    by_step = {item.step: item for item in items}
    doomed = to_delete(list(by_step), keep, protect)
    for step in doomed:
        remove_committed(by_step[step])
    # a stale moved-aside copy whose step has a committed folder again is garbage
    for entry in names_in(directory):
        match = REPLACED_DIR.match(entry)
        if match and int(match.group(1)) in by_step and \
                by_step[int(match.group(1))].path.name != entry:
            _remove_if_abandoned(directory / entry)
    clean_uncommitted(directory)
    return doomed


def clean_uncommitted(directory: Path) -> list[str]:
    """Remove ``step-N`` folders without a commit marker whose writer is gone; their names.

    Left by a deletion killed after the marker went, or a save killed between its rename and
    its marker: never a checkpoint (readers ignore them), but nothing else removed them. A
    folder whose writer still holds its lock (a commit in progress, here or on another node) or
    is a live process here is left alone, and so is one holding anything a save does not write
    (not ours to delete).
    """
    removed = []
    for name in names_in(directory):
        path = directory / name
        if not STEP_DIR.match(name) or path.is_symlink() or not path.is_dir() \
                or marker.load(path) is not marker.MISSING or not _only_ours(path):
            continue
        if _remove_if_abandoned(path):
            removed.append(name)
    return removed


def _only_ours(folder: Path) -> bool:
    """Whether ``folder`` holds only what a save writes (its files, DCP's, the writer's lock and
    owner record, the marker's temporary file), none of them a link."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                name = entry.name
                if entry.is_symlink():
                    return False
                if name == marker.SHARDED and entry.is_dir(follow_symlinks=False):
                    with os.scandir(entry.path) as inner:
                        if any(e.is_symlink() or not e.is_file(follow_symlinks=False) for e in inner):
                            return False
                elif not (name in (marker.REPLICATED, *marker.WRITER_FILES)
                          or marker.is_rank_file(name)
                          or (name.startswith(f".{MARKER}.") and name.endswith(".tmp"))):
                    return False
    except OSError:
        return False
    return True


class PartialFolder:
    """A checkpoint being written: a ``.partial-`` folder locked by its writer.

    Created by the process that commits (rank 0); other ranks only write files into it.
    """

    def __init__(self, directory: Path, step: int, name: str | None = None) -> None:
        self.directory = directory
        self.step = step
        self.path = directory / (name or layout.partial_dirname(step))
        self._lock_fd: int | None = None

    def create(self) -> None:
        """Make the folder, take its lock and record the owner (host, PID, time).

        It is made under a ``.creating-`` name and renamed once locked and owned, so a
        ``.partial-`` folder always says whether its writer is alive: one a kill left is removed
        by the next clean-up at once, not after a grace period (the lock moves with the folder).
        """
        staging = self.directory / f".creating-{self.path.name.lstrip('.')}"
        staging.mkdir(parents=False, exist_ok=False)
        try:
            self._lock_fd = os.open(staging / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # advisory (read by clean-up only), so no fsync: a lost owner file after a power
            # cut just means the folder is treated as abandoned, which it then is
            (staging / OWNER).write_text(json_text(
                {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}))
            os.rename(staging, self.path)
        except BaseException:
            self.release()
            shutil.rmtree(staging, ignore_errors=True)
            raise

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
        final = self.directory / layout.step_dirname(self.step)
        aside: Path | None = None
        content = self._note_backwards(marker)
        try:
            if final.exists():
                aside = self.directory / \
                    f".replaced-{layout.step_dirname(self.step)}-{secrets.token_hex(4)}"
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
        # still named .partial-: ignored, as it should be. The lock moved with the folder and is
        # held until the marker is there: a clean-up in another process meanwhile sees a live
        # writer, not a step-N folder without a marker to remove.
        atomic_write(final / MARKER, json_text(content, indent=1, sort_keys=True) + "\n")
        fsync_dir(self.directory)
        for name in (OWNER, LOCK):   # a kill before these go leaves them: readers ignore them
            try:
                (final / name).unlink()
            except FileNotFoundError:
                pass
        self.release()
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        self.path = final
        return final

    def _note_backwards(self, content: dict[str, Any]) -> dict[str, Any]:
        """Record and warn when a higher step is already committed: a resume would load it,
        not this one (see :class:`scaletrain.checkpoint.layout.Choice`)."""
        higher = layout.highest_committed(self.directory)
        if higher is None or higher.step <= self.step:
            return content
        warnings.warn(f"checkpoint step {self.step} saved in {self.directory}, which already holds "
                      f"step {higher.step}: the step went backwards, and a resume loads the highest "
                      f"step ({higher.step}), not this one; use a new checkpoint folder per run, or "
                      "move the old steps aside", stacklevel=2)
        return {**content, layout.SAVED_AFTER: higher.step}

    def abandon(self) -> None:
        """Remove the folder after a failed save (best effort)."""
        self.release()
        shutil.rmtree(self.path, ignore_errors=True)


def clean_partials(directory: Path, *, exclude: AbstractSet[str] = frozenset()) -> list[str]:
    """Remove ``.partial-`` folders whose writer is gone (and ``.creating-`` ones a kill left
    before their lock: after :data:`GRACE_S`); returns their names.

    A folder is left alone when its lock is held (a live save, here or on another node
    where the file system honours flock), or when its owner is a live process on this host.
    """
    removed = []
    for name in names_in(directory):
        if name in exclude or not (PARTIAL_DIR.match(name) or CREATING_DIR.match(name)):
            continue
        if _remove_if_abandoned(directory / name):
            removed.append(name)
    return removed


def busy_partials(directory: Path, *, exclude: AbstractSet[str] = frozenset()) -> list[str]:
    """``.partial-`` folders whose writer is alive (its lock is held): another save in
    progress. Call after :func:`clean_partials`."""
    return sorted(name for name in names_in(directory)
                  if name not in exclude and PARTIAL_DIR.match(name)
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
        if not lock.exists() and not (path / OWNER).exists() and \
                time.time() - path.stat().st_mtime < GRACE_S:
            return False   # being created (mkdir, then the lock), or an older writer's commit
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
        owner = read_json(path / OWNER)
        host, pid = owner["host"], int(owner["pid"])
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
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
