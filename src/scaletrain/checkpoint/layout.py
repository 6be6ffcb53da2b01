"""The checkpoint folder as its readers see it: names, the commit marker, "latest".

Pure file-system logic, no torch: every rule about which folder counts lives here, so the
writer, the loader, ``status``, ``report`` and the tests share one answer. How a step folder is
written, committed, pruned and cleaned up is :mod:`scaletrain.checkpoint.stepfolder`.

- ``step-00001200/`` is a committed checkpoint only when ``step-00001200/COMMIT.json`` exists,
  parses, names step 1200 and lists files that are all there with their sizes. The marker is
  the last thing a save writes (atomically: temporary file, fsync, rename).
- A save writes into ``.partial-step-00001200-<token>/`` and renames it once every rank's
  files are fsynced; a folder that a kill left behind keeps its ``.partial-`` name (or has
  no marker) and is ignored by every reader.
- Latest = the committed folder with the highest step whose listed files are all there with
  their sizes (no symlink that could dangle) and, for a checkpoint of up to :data:`VERIFY_BYTES`,
  match their checksums. :func:`choose` is that rule, the only one:
  ``status``, ``report``, ``cancel`` and the resume (``reader``) all call it, so they name the
  same checkpoint. A step that goes backwards (step 110 saved while step 300 is on disk: a run
  that started over in the same folder) is recorded in the new marker and warned about, at the
  save and by every reader, because the resume still loads the higher step.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.checkpoint import checksum, marker
from scaletrain.checkpoint.marker import MARKER
from scaletrain.contract.files import STEP_DIR_PREFIX
from scaletrain.fileio import fsync_dir

FORMAT = marker.CHECKSUMS_SINCE  # version of the folder layout; a reader refuses newer ones
# (2: every listed file has its checksum; 1: checksums optional, as before they existed)

STEP_DIR = re.compile(rf"^{STEP_DIR_PREFIX}(\d{{8,}})$")
PARTIAL_DIR = re.compile(rf"^\.partial-{STEP_DIR_PREFIX}(\d{{8,}})-[0-9a-f]+$")
# a committed folder moved aside while the same step is saved again (see commit())
REPLACED_DIR = re.compile(rf"^\.replaced-{STEP_DIR_PREFIX}(\d{{8,}})-[0-9a-f]+$")


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
    for name in names_in(directory):
        match = STEP_DIR.match(name)
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
        match = STEP_DIR.match(entry.name) or REPLACED_DIR.match(entry.name)
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
# choose() reads the checksums of the checkpoints it judges while their files add up to at most this
# many bytes a call: a small checkpoint (tests, small models: 4-6 ms for 16 MiB in the page cache,
# docs/long-jobs.md) is then judged exactly as the resume judges it; a bigger one is chosen by its
# sizes, and Choice.unread says so. Per call: 'status' over N run folders reads at most N times this.
VERIFY_BYTES = 16 * 1024 ** 2


@dataclass(frozen=True, kw_only=True)
class Choice:
    """What "the latest checkpoint" of a folder is (:func:`choose`), and what was passed over."""

    item: Committed | None
    skipped: tuple[tuple[Path, str], ...] = ()   # newer committed folders whose files are not intact
    backwards: tuple[tuple[int, int], ...] = ()  # (step, the higher step on disk when it was saved)
    # the chosen checkpoint's checksums were not read here (its files exceed the bound, or this
    # Python lacks their algorithm): chosen by its sizes; the resume reads every byte
    unread: bool = False

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


def choose(directory: Path, *, skip: AbstractSet[Path] = frozenset(), verify_bytes: int | None = None) -> Choice:
    """THE rule for "the latest checkpoint": the highest committed step whose listed files are
    all there with their sizes and, within a bound, match their checksums; ``skip`` (folders
    found damaged otherwise) passed over.

    Checksums are read while the files read add up to at most ``verify_bytes`` (default
    :data:`VERIFY_BYTES`; 0 reads none): a small checkpoint is then judged byte for byte, as the
    resume judges it. A bigger one is chosen by its sizes (``Choice.unread``): a change of its
    bytes that keeps the sizes is found by the resume, which sets it aside as ``damaged-*``, and
    from then on every caller of this rule agrees again.
    """
    budget = VERIFY_BYTES if verify_bytes is None else verify_bytes
    skipped: list[tuple[Path, str]] = []
    chosen, unread = None, False
    items = candidates(directory)
    for item in items:
        why = "found damaged" if item.path in skip else verify_files(item.path, item.marker)
        if why is None:
            why, read = _checksum_problem(item, budget)
            budget -= read or 0
            if why is None:
                chosen, unread = item, read is None
                break
        skipped.append((item.path, why))
    backwards = tuple(sorted((i.step, i.marker[SAVED_AFTER]) for i in items
                             if _count(i.marker.get(SAVED_AFTER)) and i.marker[SAVED_AFTER] > i.step))
    return Choice(item=chosen, skipped=tuple(skipped), backwards=backwards, unread=unread)


def _checksum_problem(item: Committed, budget: int) -> tuple[str | None, int | None]:
    """(the first file whose bytes do not match the marker's checksum, or None; the bytes read).

    None read: not judged by checksums (the files exceed ``budget``, or this Python lacks the
    algorithm). A marker that records none (before checksums existed) is judged by its sizes,
    as the resume judges it: 0 bytes read.
    """
    algorithm, _ = checksum.recorded(item.marker)
    if not algorithm:
        return None, 0
    size = sum(item.marker["files"].values())
    if size > budget or not checksum.available(algorithm):
        return None, None
    return checksum.first_mismatch(item.path, item.marker, item.marker["files"]), size


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def names_in(directory: Path) -> list[str]:
    """The names in ``directory`` (none when it does not exist yet)."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
