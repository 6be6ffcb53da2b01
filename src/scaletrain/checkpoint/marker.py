"""The commit marker's content, and the files of a step folder, checked before anything trusts them.

``COMMIT.json`` is written whole (temporary file + rename), so a marker that is not valid was
damaged or edited after the save. Every field a reader uses is checked for its shape here, so
a damaged or forged marker is one line naming the field, never an exception deep in a load;
file names outside the folder (``../../etc/passwd``, absolute paths) are refused, and so is a
key named twice (JSON keeps the last one, which could hide a second value).

The marker is complete, or the checkpoint does not count: it lists every file of its folder
(nothing unlisted is there, so nothing unchecked can be read), and it lists every file its
format needs (``replicated.pt``, a ``rank-N.pt`` per rank of ``world_size``, DCP's
``sharded/.metadata`` when an object is stored sharded). The names of a step folder's files
are declared here, for the writer and every reader.
"""

from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from scaletrain.checkpoint.checksum import ALGORITHMS, block_count
from scaletrain.contract.files import COMMIT_MARKER
from scaletrain.fileio import read_json

MARKER = COMMIT_MARKER   # the contract's name: status and report read it too
REPLICATED = "replicated.pt"      # rank 0's torch.save of the state every rank holds alike
SHARDED = "sharded"               # DCP's files: a .distcp per rank and .metadata
DCP_METADATA = ".metadata"
WRITER_FILES = (".lock", ".owner.json")   # the writer's lock and owner record (stepfolder): never read
_RANK_FILE = re.compile(r"^rank-\d{5,}\.pt$")


def shown(name: str) -> str:
    """``name`` as a message shows it: as it is, or quoted when it holds a newline, a control
    character or bytes that are not UTF-8 (a message stays one line)."""
    return name if name.isprintable() else repr(name)


def rank_file(rank: int) -> str:
    """The per-rank file name: ``rank-00003.pt``."""
    return f"rank-{rank:05d}.pt"


def is_rank_file(name: str) -> bool:
    """Whether ``name`` is a per-rank file's name."""
    return _RANK_FILE.match(name) is not None


class Unreadable(str):
    """What load() returns when the marker exists but could not be read (an I/O error, no
    permission) or is no marker at all (not JSON, too deep): its text is the reason."""


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()   # what load() returns when there is no marker: an object no JSON can equal
_HEX8 = re.compile(r"^[0-9a-f]{8}$")
CHECKSUMS_SINCE = 2  # the marker format from which every listed file must have a checksum


def load(folder: Path) -> Any:
    """The marker's parsed JSON, :data:`MISSING`, or an :class:`Unreadable` naming why it
    could not be read (an I/O error, not JSON, deeper or larger than a marker can be)."""
    try:
        return read_json(folder / MARKER, unique_keys=True)  # a pipe or device is refused, not waited on
    except FileNotFoundError:
        return MISSING
    except OSError as exc:
        return Unreadable(f"it cannot be read ({exc.strerror or exc})")
    except ValueError as exc:
        detail = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        return Unreadable(f"it is not valid JSON ({detail})")


def load_problem(data: Any) -> str | None:
    """Why what :func:`load` returned is no JSON at all (unreadable, not JSON), or None."""
    return str(data) if isinstance(data, Unreadable) else None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _value(value: Any) -> str:
    """A hand-edited field's value as a message shows it: as JSON spells it, never Python's
    True, inf or nan, a string or a number cut short."""
    if isinstance(value, bool) or value is None:
        return "null" if value is None else str(value).lower()
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else "a number too large for a float"
    if isinstance(value, int):
        digits = len(str(abs(value))) if abs(value) < 10 ** 4000 else 4000
        return str(value) if digits <= 20 else f"a {digits}-digit number"
    if isinstance(value, str):
        return repr(value[:60] + ("..." if len(value) > 60 else ""))
    return f"a {_kind(value)}"


def _count(value: Any, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum


def problem(data: Any) -> str | None:
    """Why parsed JSON is not a commit marker this scaletrain can trust, or None."""
    if not isinstance(data, dict):
        return f"it holds a {_kind(data)}, not an object"
    if not _count(data.get("step"), 0):
        return f"'step' is {_value(data.get('step'))}, not a step number"
    files = data.get("files")
    if not isinstance(files, dict):
        return f"'files' is a {_kind(files)}, not an object of file names and sizes"
    for rel, size in files.items():
        why = unsafe_name(rel)
        if why:
            return why
        if not _count(size, 0):
            return f"'files' gives {rel!r} the size {_value(size)}, not a number of bytes"
    objects = data.get("objects", {})
    if not isinstance(objects, dict):
        return f"'objects' is a {_kind(objects)}, not an object of state names"
    for name, info in objects.items():
        if not isinstance(info, dict) or not isinstance(info.get("sharded", False), bool) \
                or not isinstance(info.get("kind", ""), str):
            return f"'objects' describes {name!r} as {info!r}, not as {{kind, sharded}}"
    for key in ("format", "world_size"):
        if not _count(data.get(key, 1), 1):
            return f"'{key}' is {_value(data.get(key))}, not a positive integer"
    return _checksum_problem(data, files)


def _checksum_problem(data: dict[str, Any], files: dict[str, Any]) -> str | None:
    """Why the marker's checksums do not cover exactly the files it lists, or None.

    A file without its checksum would load unverified, so a marker that records checksums
    must record one for every file it lists, and one written since checksums are always taken
    (format 2) must record them: an entry removed, emptied or renamed is damage, not a pass.
    Only a format-1 marker with no checksums at all (written before they existed) goes by its
    sizes alone.
    """
    present = [a for a in ALGORITHMS if a in data]
    if not present:
        if data.get("format", 1) >= CHECKSUMS_SINCE:
            return f"it records no checksums ('{ALGORITHMS[0]}' is missing)"
        return None
    if len(present) > 1:
        return f"it records two kinds of checksum ({', '.join(present)}), not one"
    algorithm = present[0]
    crcs = data[algorithm]
    if not isinstance(crcs, dict) or any(
            not isinstance(v, str) or not _HEX8.match(v) or k not in files
            for k, v in crcs.items()):
        return f"'{algorithm}' is not an object of listed files and 8-digit hex checksums"
    unchecked = sorted(set(files) - set(crcs))
    if unchecked:
        more = f" and {len(unchecked) - 1} more" if len(unchecked) > 1 else ""
        return f"'{algorithm}' has no checksum for {unchecked[0]!r}{more}"
    return _blocks_problem(data.get("blocks"), algorithm, files) if "blocks" in data else None


def _blocks_problem(blocks: Any, algorithm: str, files: dict[str, Any]) -> str | None:
    """Why the per-block checksums (``"blocks": {"bytes": B, algorithm: {file: hex...}}``) do
    not cover every listed file exactly, or None. Without them a file is checked whole."""
    size: Any = blocks.get("bytes") if isinstance(blocks, dict) else None
    if not isinstance(blocks, dict) or not _count(size, 1) or size & (size - 1) \
            or not 4096 <= size <= 1 << 30:
        return "'blocks' has no block size (a power of two from 4 KiB to 1 GiB)"
    table = blocks.get(algorithm)
    if not isinstance(table, dict) or set(table) != set(files) or len(blocks) != 2:
        return f"'blocks' does not give '{algorithm}' checksums for exactly the listed files"
    for rel, text in table.items():
        count = block_count(files[rel], size)
        if not isinstance(text, str) or len(text) != 8 * count or text.strip("0123456789abcdef"):
            return f"'blocks' does not give {rel!r} its {count} checksum(s) of 8 hex digits"
    return None


def unsafe_name(rel: Any) -> str | None:
    """Why ``rel`` may not name a file of a checkpoint folder (absolute, ``..``), or None."""
    if not isinstance(rel, str) or not rel:
        return f"'files' lists {rel!r}, not a file name"
    parts = rel.split("/")
    if rel.startswith("/") or "\\" in rel or "\0" in rel or \
            any(p in ("", ".", "..") for p in parts):
        return f"'files' lists {rel!r}, a path outside the checkpoint folder: refused"
    return None


def verify_files(folder: Path, data: dict[str, Any]) -> str | None:
    """First problem with the files of a valid marker's folder, or None: a file the format needs
    that it does not list, a file there that it does not list, a listed one that is missing, of
    another size, not a regular file, or leading outside the folder. Checksums are checked by
    whoever reads the bytes (``verified``).

    Each sub-folder is listed once and each file costs one ``lstat``: a checkpoint of 24,000
    ranks lists 48,000 files, and resolving every path (a system call per path component)
    took longer than a ``status`` may (docs/scale.md). A symbolic link is resolved and must
    stay inside the folder."""
    files = data["files"]
    why = missing_from(data) or _unlisted(folder, files)
    if why:
        return why
    root = folder.resolve()
    listed: dict[str, dict[str, os.DirEntry[str]] | str] = {}
    for rel, size in files.items():
        parent, _, name = rel.rpartition("/")
        entries = listed.get(parent)
        if entries is None:
            entries = listed[parent] = _listing(folder, parent, root)
        if isinstance(entries, str):        # the sub-folder itself is missing or leads outside
            return entries.format(rel=shown(rel))
        entry = entries.get(name)
        if entry is None:
            return f"{shown(rel)} is missing"
        try:
            if entry.is_symlink():
                path = folder / rel
                if not path.resolve().is_relative_to(root):
                    return f"{shown(rel)} leads outside the checkpoint folder (a symbolic link): refused"
                info = path.stat()
            else:
                info = entry.stat(follow_symlinks=False)
        except (OSError, RuntimeError, ValueError):  # gone meanwhile, a loop of links, a name refused
            return f"{shown(rel)} is missing"
        if not stat.S_ISREG(info.st_mode):
            return f"{shown(rel)} is not a regular file: refused"
        if info.st_size != size:
            return f"{shown(rel)} has {info.st_size} bytes, the commit marker says {size} (truncated?)"
    return None


def missing_from(data: dict[str, Any]) -> str | None:
    """The first file the format needs that a valid marker does not list, as a problem, or None:
    ``replicated.pt``, a rank file per rank, DCP's metadata when an object is stored sharded.
    (Checkpoints of format 1, from before the marker listed every file, are not held to it.)"""
    if data.get("format", 1) < CHECKSUMS_SINCE:
        return None
    files = data["files"]
    world = data.get("world_size", 1)
    needed = [REPLICATED]
    if any(info.get("sharded") for info in data.get("objects", {}).values()):
        needed.append(f"{SHARDED}/{DCP_METADATA}")
    # the rank files listed are counted first: a forged world of 10**12 is not walked (of ranks
    # 0..count, one at least is missing when the world is larger)
    ranks = sum(1 for rel in files if is_rank_file(rel))
    needed.extend(rank_file(r) for r in range(min(world, ranks + 1)))
    gone = next((rel for rel in needed if rel not in files), None)
    return None if gone is None else \
        f"the commit marker does not list {gone}, which a checkpoint of {world} process(es) holds"


def _unlisted(folder: Path, files: dict[str, Any]) -> str | None:
    """The first entry of ``folder`` (and of its ``sharded/``) that ``files`` does not list."""
    for sub in ("", SHARDED):
        try:
            with os.scandir(folder / sub if sub else folder) as entries:
                names = sorted(e.name for e in entries)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{sub or folder.name} cannot be listed ({exc.strerror or exc})"
        for name in names:
            rel = f"{sub}/{name}" if sub else name
            if rel in files or (not sub and name in (MARKER, SHARDED, *WRITER_FILES)):
                continue
            return f"{rel!r} is in the folder but not in the commit marker: refused (move it out " \
                   "if you put it there)"
    return None


def _listing(folder: Path, parent: str, root: Path) -> dict[str, os.DirEntry[str]] | str:
    """The entries of ``folder/parent`` by name, or the problem (a format string of ``rel``)."""
    where = folder / parent if parent else folder
    if parent and not where.resolve().is_relative_to(root):
        return "{rel} leads outside the checkpoint folder (a symbolic link): refused"
    try:
        with os.scandir(where) as it:
            return {entry.name: entry for entry in it}
    except OSError:
        return "{rel} is missing"
