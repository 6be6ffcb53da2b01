"""Whether a folder is a finished Python environment for jobs, and how ``env create`` makes one
appear whole.

``env create`` builds into a hidden folder beside the target (``.NAME.partial-<token>``), with a
stamp naming the building process, and renames it into place only when every step passed, its
``bin/`` rewritten to the final path and :data:`ENV_MARKER` written last. A build killed
part-way therefore leaves no folder under the target's name (a rerun removes the dead build's
partial folder and starts again), and :func:`finished_env` is the one rule that ``--venv``
and the pre-sbatch check ask: "is this a finished environment, or why not".
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
from pathlib import Path

from scaletrain.fileio import atomic_write, fsync_dir, json_text, read_json_object

ENV_MARKER = "scaletrain-env.json"     # written last into an environment env create finished
STAMP = ".scaletrain-building.json"    # written first into a partial build: who builds it
_PARTIAL = re.compile(r"^\.(?P<name>.+)\.partial-[0-9a-f]{8}$")
_REWRITE_MAX = 1 << 20                 # bin/ scripts are small; a bigger file is a binary, left alone


def finished_env(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is not a finished Python environment, or None when it is one.

    A folder with a ``bin/python`` (a link into a container counts: it resolves only inside) is
    one, unless it is a build of ``env create`` that has not finished. What the environment can
    import is the pre-sbatch check's question, not this one.
    """
    folder = Path(path)
    if not os.path.lexists(folder):
        return f"{folder} does not exist"
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if _PARTIAL.match(folder.name) or (folder / STAMP).exists():
        return (f"{folder} is a build of 'scaletrain env create' that did not finish "
                "(stopped part-way)")
    if not os.path.lexists(folder / "bin" / "python"):
        return f"{folder} has no bin/python: not a Python environment"
    return None


def partial_dir(target: Path) -> Path:
    """A fresh hidden folder beside ``target`` to build in, stamped with this process."""
    partial = target.parent / f".{target.name}.partial-{secrets.token_hex(4)}"
    partial.mkdir(parents=True)
    atomic_write(partial / STAMP, json_text({"host": socket.gethostname(), "pid": os.getpid()}))
    return partial


def stale_builds(target: Path) -> list[Path]:
    """Partial folders of ``target`` whose builder is gone (its process on this host has ended):
    what a killed ``env create`` left, safe to remove."""
    found = []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    for name in names:
        match = _PARTIAL.match(name)
        if match is None or match.group("name") != target.name:
            continue
        stamp = read_json_object(target.parent / name / STAMP) or {}
        pid = stamp.get("pid")
        if stamp.get("host") == socket.gethostname() and isinstance(pid, int) and not _alive(pid):
            found.append(target.parent / name)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def finish(partial: Path, target: Path, record: dict[str, str]) -> None:
    """Move a completed build into place: ``bin/`` and ``pyvenv.cfg`` pointed at ``target``,
    the stamp removed, :data:`ENV_MARKER` written, then one rename (``target`` missing or empty)."""
    old, new = os.fsencode(partial), os.fsencode(target)
    files = [partial / "pyvenv.cfg"]
    try:
        files += [p for p in (partial / "bin").iterdir() if not p.is_symlink()]
    except OSError:
        pass
    for path in files:
        try:
            if not path.is_file() or path.stat().st_size > _REWRITE_MAX:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        # shebangs and activate scripts name the folder they were made in (its path, and its
        # name as the prompt); the partial name's random token makes the replacement exact
        fixed = data.replace(old, new).replace(os.fsencode(partial.name), os.fsencode(target.name))
        if fixed != data:
            atomic_write(path, fixed, mode=path.stat().st_mode & 0o7777)
    (partial / STAMP).unlink()
    atomic_write(partial / ENV_MARKER, json_text(record, indent=1) + "\n")
    os.rename(partial, target)
    fsync_dir(target.parent)


def discard(partial: Path) -> None:
    """Remove a build that failed (nothing of it stays under the target's name anyway)."""
    shutil.rmtree(partial, ignore_errors=True)
