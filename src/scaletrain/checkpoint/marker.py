"""The commit marker's content, checked field by field before anything trusts it.

``COMMIT.json`` is written whole (temporary file + rename), so a marker that is not valid was
damaged or edited after the save. Every field a reader uses is checked for its shape here, so
a damaged or forged marker is one line naming the field, never an exception deep in a load;
file names outside the folder (``../../etc/passwd``, absolute paths) are refused.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from scaletrain.checkpoint.checksum import ALGORITHMS
from scaletrain.contract.files import COMMIT_MARKER
from scaletrain.fileio import read_bounded

MARKER = COMMIT_MARKER   # the contract's name: status and report read it too
MISSING, GARBAGE = "missing", "garbage"  # what load() returns instead of JSON


class Unreadable(str):
    """What load() returns when the marker exists but reading it failed (an I/O error, no
    permission): its text is the reason. Not damage of the checkpoint: the disk's."""
_HEX8 = re.compile(r"^[0-9a-f]{8}$")
CHECKSUMS_SINCE = 2  # the marker format from which every listed file must have a checksum


def load(folder: Path) -> Any:
    """The marker's parsed JSON, :data:`MISSING`, :data:`GARBAGE` (not JSON) or an
    :class:`Unreadable` naming why it could not be read."""
    try:
        text = read_bounded(folder / MARKER).decode("utf-8")     # a pipe or device is refused, not waited on
    except FileNotFoundError:
        return MISSING
    except OSError as exc:
        return Unreadable(f"it cannot be read ({exc.strerror or exc})")
    except UnicodeDecodeError:
        return GARBAGE
    try:
        return json.loads(text)
    except ValueError:
        return GARBAGE


def load_problem(data: Any) -> str | None:
    """Why what :func:`load` returned is no JSON at all (unreadable, not JSON), or None."""
    if isinstance(data, Unreadable):
        return str(data)
    return "it is not valid JSON" if data == GARBAGE else None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _count(value: Any, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum


def problem(data: Any) -> str | None:
    """Why parsed JSON is not a commit marker this scaletrain can trust, or None."""
    if not isinstance(data, dict):
        return f"it holds a {_kind(data)}, not an object"
    if not _count(data.get("step"), 0):
        return f"'step' is {data.get('step')!r}, not a step number"
    files = data.get("files")
    if not isinstance(files, dict):
        return f"'files' is a {_kind(files)}, not an object of file names and sizes"
    for rel, size in files.items():
        why = unsafe_name(rel)
        if why:
            return why
        if not _count(size, 0):
            return f"'files' gives {rel!r} the size {size!r}, not a number of bytes"
    objects = data.get("objects", {})
    if not isinstance(objects, dict):
        return f"'objects' is a {_kind(objects)}, not an object of state names"
    for name, info in objects.items():
        if not isinstance(info, dict) or not isinstance(info.get("sharded", False), bool) \
                or not isinstance(info.get("kind", ""), str):
            return f"'objects' describes {name!r} as {info!r}, not as {{kind, sharded}}"
    for key in ("format", "world_size"):
        if not _count(data.get(key, 1), 1):
            return f"'{key}' is {data.get(key)!r}, not a positive integer"
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
    """First problem with the files a valid marker lists (leading outside the folder,
    missing, wrong size), or None. Checksums are checked by the loading ranks (``reader``).

    Each sub-folder is listed once and each file costs one ``lstat``: a checkpoint of 24,000
    ranks lists 48,000 files, and resolving every path (a system call per path component)
    took longer than a ``status`` may (docs/scale.md). A symbolic link is resolved as before
    and must stay inside the folder."""
    root = folder.resolve()
    listed: dict[str, dict[str, os.DirEntry[str]] | str] = {}
    for rel, size in data["files"].items():
        parent, _, name = rel.rpartition("/")
        entries = listed.get(parent)
        if entries is None:
            entries = listed[parent] = _listing(folder, parent, root)
        if isinstance(entries, str):        # the sub-folder itself is missing or leads outside
            return entries.format(rel=rel)
        entry = entries.get(name)
        if entry is None:
            return f"{rel} is missing"
        try:
            if entry.is_symlink():
                path = folder / rel
                if not path.resolve().is_relative_to(root):
                    return f"{rel} leads outside the checkpoint folder (a symbolic link): refused"
                actual = path.stat().st_size
            else:
                actual = entry.stat(follow_symlinks=False).st_size
        except OSError:
            return f"{rel} is missing"
        if actual != size:
            return f"{rel} has {actual} bytes, the commit marker says {size} (truncated?)"
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
