"""The checkpoint folder as its readers see it: names, the commit marker, "latest".

Pure file-system logic, no torch: every rule about which folder counts lives here, so the
writer, the loader, ``status``, ``report`` and the tests share one answer. How a step folder is
written, committed, pruned and cleaned up is :mod:`scaletrain.checkpoint.stepfolder`.

- ``step-00001200/`` is a committed checkpoint only when ``step-00001200/COMMIT.json`` exists,
  parses, names step 1200 and lists files that are all there with their sizes, every file of
  the folder and every file its format needs (:func:`marker.verify_files`). The marker is
  the last thing a save writes (atomically: temporary file, fsync, rename).
- A save writes into ``.partial-step-00001200-<token>/`` and renames it once every rank's
  files are fsynced; a folder that a kill left behind keeps its ``.partial-`` name (or has
  no marker) and is ignored by every reader.
- Latest = the committed folder with the highest step whose listed files are all there with
  their sizes (no symlink that could dangle) and, for a checkpoint of up to :data:`VERIFY_BYTES`,
  match their checksums. :func:`choose` is that rule, the only one:
  ``status``, ``report``, ``cancel`` and the resume (``reader``) all call it, so they name the
  same checkpoint; it also says what stops a resume that is not damage (a newer layout, a
  checksum this Python cannot compute) and which newer folders hold a damaged marker. A step that goes backwards (step 110 saved while step 300 is on disk: a run
  that started over in the same folder) is recorded in the new marker and warned about, at the
  save and by every reader, because the resume still loads the higher step.
"""

from __future__ import annotations

from collections.abc import Mapping, Set as AbstractSet

import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.checkpoint import checksum, marker, verified
from scaletrain.checkpoint.marker import MARKER
from scaletrain.contract.files import STEP_DIR_PREFIX
from scaletrain.fileio import fsync_dir

FORMAT = marker.CHECKSUMS_SINCE  # version of the folder layout; a reader refuses newer ones
# (2: every listed file has its checksum; 1: checksums optional, as before they existed)

# a step's digits as step_dirname writes them: 8 at least, no zero beyond (a second name for a
# step, step-000000030 beside step-00000030, is no checkpoint of ours: never chosen, never removed)
STEP_DIR = re.compile(rf"^{STEP_DIR_PREFIX}(\d{{8}}|[1-9]\d{{8,}})$")
PARTIAL_DIR = re.compile(rf"^\.partial-{STEP_DIR_PREFIX}(\d{{8}}|[1-9]\d{{8,}})-[0-9a-f]+$")
# a partial folder before its lock and owner record are in it (renamed to .partial- then)
CREATING_DIR = re.compile(rf"^\.creating-partial-{STEP_DIR_PREFIX}(\d{{8}}|[1-9]\d{{8,}})-[0-9a-f]+$")
# a committed folder moved aside while the same step is saved again (see commit())
REPLACED_DIR = re.compile(rf"^\.replaced-{STEP_DIR_PREFIX}(\d{{8}}|[1-9]\d{{8,}})-[0-9a-f]+$")


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
    return _scan(directory)[1]


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
    return _scan(directory)[0]


def _scan(directory: Path) -> tuple[list[Committed], list[tuple[int, Path, str]]]:
    """(:func:`committed`, :func:`damaged`) from one listing, each marker read once."""
    found: dict[int, Committed] = {}
    replaced: dict[int, Committed] = {}
    bad: list[tuple[int, Path, str]] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return [], []
    for entry in entries:
        match = STEP_DIR.match(entry.name) or REPLACED_DIR.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        step, path = int(match.group(1)), Path(entry.path)
        data = marker.load(path)
        if data is marker.MISSING:
            continue
        why = marker.load_problem(data) or marker.problem(data)
        if why is None and data["step"] != step:
            why = f"it names step {data['step']}"
        if why is not None:
            if entry.name.startswith(STEP_DIR_PREFIX):
                bad.append((step, path, f"{MARKER}: {why}"))
            continue
        item = Committed(step=step, path=path, marker=data)
        (found if entry.name.startswith(STEP_DIR_PREFIX) else replaced)[step] = item
    for step, item in replaced.items():
        found.setdefault(step, item)
    return [found[s] for s in sorted(found)], sorted(bad)


def highest_committed(directory: Path) -> Committed | None:
    """The committed checkpoint with the highest step, by its marker alone (its files are not
    looked at: a damaged one counts), or None. Not "the latest checkpoint": that is
    :func:`choose`."""
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
    # newer step folders whose marker is there but not valid (not JSON, a field of the wrong shape)
    bad_markers: tuple[tuple[Path, str], ...] = ()
    backwards: tuple[tuple[int, int], ...] = ()  # (step, the higher step on disk when it was saved)
    # the chosen checkpoint's checksums were not read here (its files exceed the bound, or this
    # Python lacks their algorithm): chosen by its sizes; the resume reads every byte
    unread: bool = False
    # (message, hint) when the chosen checkpoint is one this scaletrain must not load although it
    # is not damaged (a newer layout, checksums this Python cannot compute): a resume stops there
    refusal: tuple[str, str] | None = None
    older: int | None = None   # the next committed step below the chosen one (for hints)

    @property
    def step(self) -> int | None:
        """The chosen step, or None (no intact committed checkpoint)."""
        return self.item.step if self.item is not None else None

    def damage(self) -> list[tuple[Path, str]]:
        """Every folder passed over as damaged, newest first: (folder, why)."""
        return sorted(self.skipped + self.bad_markers, key=lambda d: d[0].name, reverse=True)

    def notes(self) -> list[str]:
        """One line per thing a user should know about the choice (damage, a refusal, a step
        gone back)."""
        refused = [f"{self.refusal[0]} ({self.refusal[1]})"] if self.refusal else []
        return [f"checkpoint {path.name} is damaged ({why}): passed over"
                for path, why in self.damage()] + refused + self.backwards_notes()

    def backwards_notes(self) -> list[str]:
        """One line per lower step saved after a higher one that the resume still prefers."""
        return [f"checkpoint step {step} was saved after step {after} (the step went backwards: "
                f"a run started over in this folder?); a resume loads the highest step, "
                f"{self.item.step}; use a new checkpoint folder per run"
                for step, after in self.backwards if self.item is not None and self.item.step > step]


def choose(directory: Path, *, skip: Mapping[Path, str] | AbstractSet[Path] = frozenset(),
           verify_bytes: int | None = None) -> Choice:
    """THE rule for "the latest checkpoint": the highest committed step whose folder's files are
    all there, listed and of their sizes and, within a bound, match their checksums; ``skip``
    (folders found damaged otherwise, with why where known) passed over.

    Checksums are read while the files read add up to at most ``verify_bytes`` (default
    :data:`VERIFY_BYTES`; 0 reads none): a small checkpoint is then judged byte for byte, as the
    resume judges it. A bigger one is chosen by its sizes (``Choice.unread``): a change of its
    bytes that keeps the sizes is found by the resume, which sets it aside as ``damaged-*``, and
    from then on every caller of this rule agrees again. A checkpoint of a newer layout, or with
    checksums this Python cannot compute, ends the walk with ``Choice.refusal``: it is not
    damage, and an older step is not what the user asked to resume.
    """
    budget = VERIFY_BYTES if verify_bytes is None else verify_bytes
    skipped: list[tuple[Path, str]] = []
    chosen, unread, refusal = None, False, None
    items, bad = _scan(directory)
    items.reverse()  # the highest step first
    for item in items:
        refusal = _refusal(item)
        if refusal is not None:
            chosen, unread = item, True
            break
        if item.path in skip:
            why: str | None = skip[item.path] if isinstance(skip, Mapping) else "found damaged"
        else:
            why = verify_files(item.path, item.marker)
        if why is None:
            why, read = _checksum_problem(item, budget)
            budget -= read or 0
            if why is None:
                chosen, unread = item, read is None
                break
        skipped.append((item.path, why))
    backwards = tuple(sorted((i.step, i.marker[SAVED_AFTER]) for i in items
                             if _count(i.marker.get(SAVED_AFTER)) and i.marker[SAVED_AFTER] > i.step))
    older = next((i.step for i in items if chosen is not None and i.step < chosen.step), None)
    newer_bad = tuple((path, why) for step, path, why in bad if chosen is None or step > chosen.step)
    return Choice(item=chosen, skipped=tuple(skipped), bad_markers=newer_bad, backwards=backwards,
                  unread=unread, refusal=refusal, older=older)


def _refusal(item: Committed) -> tuple[str, str] | None:
    """Why ``item`` must not be loaded by this scaletrain although it is not damaged, or None."""
    fmt = item.marker.get("format", 1)
    if fmt > FORMAT:
        return (f"checkpoint step {item.step} ({item.path}) has layout format {fmt}; this "
                f"scaletrain reads up to {FORMAT}", "upgrade scaletrain to the version that wrote "
                f"it ({str(item.marker.get('scaletrain_version', '?'))[:40]})")
    algorithm, _ = checksum.recorded(item.marker)
    if algorithm and not checksum.available(algorithm):
        return (f"checkpoint step {item.step} ({item.path}) records {algorithm.upper()} checksums "
                "and this Python cannot compute them: the crc32c package is missing",
                "pip install crc32c (a dependency of scaletrain) into the job's environment")
    return None


def _checksum_problem(item: Committed, budget: int) -> tuple[str | None, int | None]:
    """(the first file whose bytes do not match the marker's checksums, or None; the bytes read).

    None read: not judged by checksums (the files exceed ``budget``). A marker that records
    none (before checksums existed) is judged by its sizes, as the resume judges it: 0 bytes read.
    """
    algorithm, _ = checksum.recorded(item.marker)
    if not algorithm:
        return None, 0
    size = sum(item.marker["files"].values())
    if size > budget:
        return None, None
    return verified.first_mismatch(item.path, item.marker, item.marker["files"]), size


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def names_in(directory: Path) -> list[str]:
    """The names in ``directory`` (none when it does not exist yet)."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
