"""Files that appear whole or not at all.

Everything scaletrain writes for a user (a batch script, a run folder's files, a checkpoint's
marker, a report) goes through :func:`atomic_write`: the content is written to a temporary file
beside the target, flushed and fsynced, then renamed over the target. A crash, a kill or an
encoding error part-way leaves the previous file untouched (never truncated) and no partial new
one; a reader sees the old content or the new, nothing in between.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from scaletrain.errors import UsageError
from scaletrain.jsonfile import loads as json_loads

READ_LIMIT = 16 * 1024 * 1024     # a record, a marker, a job id: anything bigger is not ours
LINE_BYTES = 1024 * 1024          # a line of a file read as a stream (a record, a log line): read in pieces of this


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISFIFO, "a pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` (a link followed) is when it is there but is not a regular file ("a folder",
    "a pipe (FIFO)", "a device"...); None when it is a regular file or is not there."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else _kind(mode)


def check_replaceable(path: str | os.PathLike[str]) -> None:
    """``UsageError`` unless ``path`` is missing or a regular file: a rename over a device
    (``/dev/full``), a link, a pipe or a folder would replace it, not write into it."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return          # missing (or unreachable: the write itself will say why)
    if not stat.S_ISREG(mode):
        raise UsageError(f"{os.fspath(path)} is {_kind(mode)}: not replaced",
                         "give the path of a regular file (or a new name)")


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading, or ``OSError`` when it is not a regular file.

    Opened non-blocking first, so a FIFO nobody writes to (or a device) is refused at once
    instead of blocking the reader for ever; links are followed to what they name.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{_kind(mode)}, not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: str | os.PathLike[str]) -> None:
    """``OSError`` unless ``path`` is (or links to) a regular file: for readers that must open by
    name (``torch.load``), so that a pipe or a device is refused instead of read for ever."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"{_kind(mode)}, not a regular file", os.fspath(path))


def read_bounded(path: str | os.PathLike[str], limit: int = READ_LIMIT) -> bytes:
    """The bytes of the regular file ``path``; ``OSError`` when it is not one or exceeds ``limit``."""
    with open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
    return data


def read_tail(path: str | os.PathLike[str], limit: int = READ_LIMIT) -> bytes:
    """The last ``limit`` bytes of the regular file ``path`` (all of it when smaller): a job's log
    or a crash dump may be gigabytes, and its end is what tells. ``OSError`` when it is not one."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            fh.seek(size - limit)
        return fh.read(limit)


def read_user_file(path: str | os.PathLike[str], *, what: str, hint: str, limit: int) -> bytes:
    """The bytes of a file the user named (a profile, a batch script, a program), read whole.

    The run folders' rules, as a ``UsageError`` (exit 2) naming ``what`` was expected: opened
    non-blocking and checked with fstat on the open file (no race with a rename), so a FIFO is
    refused at once instead of hanging the verb, a link to ``/dev/zero`` is never read, and a
    file over ``limit`` bytes is refused whole (half a file reports errors that are not there);
    the reading stops at the bound even when the file grows meanwhile. An error of the disk is
    named as one (``cannot read: Input/output error``), not as a wrong file.
    """
    shown = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"{shown}: no such file", "check the path") from None
    except OSError as exc:
        raise UsageError(f"{shown}: cannot read: {exc.strerror or exc}",
                         "check the path and its permissions") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{shown}: is a directory, not {what}", hint)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{shown}: {_kind(info.st_mode)}, not a regular file", hint)
        if info.st_size > limit:
            raise UsageError(f"{shown}: {info.st_size / 2**20:.1f} MiB; {what} is read up to "
                             f"{limit / 2**20:g} MiB", hint)
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= limit:      # the file may grow while read: never past the bound
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UsageError(f"{shown}: cannot read: {exc.strerror or exc}",
                         "an error of the disk or the file system: check it, or copy the file "
                         "elsewhere") from None
    finally:
        os.close(fd)
    if size > limit:
        raise UsageError(f"{shown}: grew past {limit / 2**20:g} MiB while read",
                         "read it once it is written")
    return b"".join(chunks)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename or creation inside ``directory`` durable (no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | os.PathLike[str], *, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file handle whose content replaces ``path`` atomically when the block ends.

    For writers that stream (``torch.save(obj, fh)``): nothing is held twice in memory. The
    temporary file beside ``path`` is flushed, fsynced and renamed over it only when the block
    ends without an exception; otherwise it is removed and ``path`` is untouched. ``mode`` sets
    the permission bits (default: those of the file being replaced, else 0o666 less the umask).
    ``UsageError`` before anything is written when ``path`` exists and is not a regular file.
    """
    target = Path(path)
    check_replaceable(target)
    if mode is None:
        try:
            mode = target.stat().st_mode & 0o7777
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(target.parent)


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None,
                 encoding: str = "utf-8") -> Path:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename); returns the path.

    Text is encoded *before* anything touches the disk, so an argument that cannot be encoded
    raises without creating or truncating a file. ``mode`` as for :func:`atomic_file`.
    """
    payload = data.encode(encoding) if isinstance(data, str) else bytes(data)
    with atomic_file(path, mode=mode) as fh:
        fh.write(payload)
    return Path(path)


def finite(value: Any) -> Any:
    """``value`` with every NaN and infinity (in lists, tuples and dicts too) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_text(value: Any, **options: Any) -> str:
    """``json.dumps`` of what we write: always valid JSON (RFC 8259 has no NaN or Infinity).

    Every JSON writer of scaletrain calls this (a test holds to it): a diverged loss or a figure
    divided by zero is written as null, never as the bare ``NaN`` that other tools refuse to parse.
    """
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:  # NaN/inf somewhere: rare, so cleaned only then (a cycle raises again)
        return json.dumps(finite(value), allow_nan=False, **options)


def json_lines(path: str | os.PathLike[str], *, line_bytes: int = LINE_BYTES) -> Iterator[Any]:
    """Each line of the JSON-lines file ``path`` parsed, streamed so memory stays bounded however
    long the file: a line longer than ``line_bytes`` is skipped whole, and so is one that is not
    JSON (half-written, edited by hand, too deep) or holds a number out of range (:mod:`scaletrain.jsonfile`).
    What a value means is its writer's reader's to decide.
    ``OSError`` when the file cannot be opened or is not a regular file (a pipe is refused)."""
    with open_regular(path) as fh:
        while True:
            raw = fh.readline(line_bytes)
            if not raw:
                return
            if len(raw) == line_bytes and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):      # the rest of an overlong line
                    raw = fh.readline(line_bytes)
                continue
            try:
                yield json_loads(raw)
            except ValueError:
                continue                                    # a half-written, hand-edited or too deep line


def read_json(path: str | os.PathLike[str], *, limit: int = READ_LIMIT, errors: str = "strict",
              unique_keys: bool = False) -> Any:
    """The JSON in the regular file ``path``, read up to ``limit`` bytes and parsed within the
    bounds of :mod:`scaletrain.jsonfile` (depth); ``OSError`` when it cannot be read or is larger,
    ``ValueError`` when it is not JSON, too deep, or (``unique_keys``) names a key twice."""
    return json_loads(read_bounded(path, limit), max_bytes=limit, errors=errors, unique_keys=unique_keys)


def read_json_object(path: str | os.PathLike[str], *, errors: str = "strict") -> dict[str, Any] | None:
    """A small JSON object from ``path``, or None when it is missing, unreadable, too deep or not
    an object. ``errors="replace"`` reads a file with stray bytes (a folder edited by hand) instead
    of refusing it."""
    try:
        value = read_json(path, errors=errors)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def tree_size_gb(path: str, *, max_entries: int = 200_000) -> float | None:
    """Size of a file or folder in GB, or None when it is not here or too big to walk quickly
    (the data ``--stage-data``/``stage_data=`` copies to node-local disk: the plan sizes that disk)."""
    p = Path(path).expanduser()
    try:
        if p.is_file():
            return p.stat().st_size / 1024 ** 3
        if not p.is_dir():
            return None
        total, seen = 0, 0
        stack = [p]
        while stack:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    seen += 1
                    if seen > max_entries:
                        return None
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        return total / 1024 ** 3
    except (OSError, ValueError):
        return None


def writable_dir(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a folder that exists and takes new files (created if missing), else UsageError.

    ``what`` names the option for the message (``"--run-dir"``). Writing is tried, not predicted
    from permission bits: root ignores them, and a read-only mount refuses root too.
    """
    from scaletrain.errors import UsageError

    folder = Path(path)
    hint = f"give {what} a folder you can write to (it is created if missing)"
    shown = str(folder) if len(str(folder)) <= 80 else str(folder)[:77] + "..."
    try:
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"{what} {shown!r} is a file, not a folder", hint)
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".scaletrain-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{what} {shown!r}: cannot write there ({exc.strerror or exc})", hint) from None
    return folder


def fresh_dir(base: Path) -> Path:
    """Create ``base`` (or ``base-2``, ``base-3``...): a folder nobody else has.

    ``mkdir`` is atomic, so two callers in the same second (two submits) get two folders.
    """
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise UsageError(f"999 folders named {base.name}* already exist", "give a folder name of your own")


def _write_stream(path: Path, payload: bytes) -> None:
    # O_NONBLOCK: a FIFO nobody reads fails at once (ENXIO) instead of waiting forever
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb", closefd=False) as stream:
            stream.write(payload)
    finally:
        os.close(fd)


def write_output(path: str, text: str, *, mode: int = 0o755, flag: str = "--output") -> None:
    """Write ``text`` to a user-named ``path`` whole or not at all (``UsageError`` on failure).

    The user's old file stays untouched until the new content is complete (temporary file +
    rename); a link keeps pointing where it did. A device or pipe (``-o /dev/stdout``) is
    written to directly: renaming over it would replace the device. ``flag`` names the option
    the path came from, for the message.
    """
    payload = text.encode("utf-8")       # fails here, before anything touches the disk
    out = Path(path).expanduser()
    try:
        if out.is_symlink():
            out = out.resolve()      # replace the file the link points to, and keep the link
        if out.is_dir():
            raise UsageError(f"{flag} {path} is a directory", "give a file name, e.g. -o job.sh")
        if out.exists() and not out.is_file():
            _write_stream(out, payload)
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, payload, mode=mode)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}",
                         f"choose a writable {flag} path") from None
