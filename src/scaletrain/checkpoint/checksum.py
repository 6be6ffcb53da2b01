"""Checksums of checkpoint files: computed while the file is written, checked before it is read.

A flipped byte in a checkpoint must never load silently (torch reads zip records without
checking their CRCs). Every file of a save goes through :class:`ChecksumWriter`, which updates a
checksum with each buffer on its way to the file, so nothing is read back. The commit marker
records them under the algorithm's name (``"crc32c": {"replicated.pt": "1a2b3c4d", ...}``) beside
the sizes; a load checks them with :func:`file_crc` (bounded ``read()`` calls into one small
buffer) before trusting the file.

The algorithm: CRC-32C (Castagnoli) through the ``crc32c`` package where it runs on the CPU's
own instruction (SSE 4.2 on x86, the CRC extension on Arm: 13.4 GB/s here, 4.0x zlib's CRC-32
measured side by side on a quiet machine, docs/benchmarks.md), else CRC-32 from zlib (about
4 GB/s on one quiet core, against 1.9 GB/s for SHA-1 and 0.9 GB/s for BLAKE2b). Both catch every
error of up to 32 consecutive bits, so any single flipped byte; neither defends against someone
forging a file (the safe loader is that, see ``safeio``). Markers written with either are
checked, whichever this machine would choose.
For large buffers the checksum runs in a helper thread while the same buffer is written (both
release the GIL) when the process has a spare core (two per process of the node), so it hides
behind the write; otherwise inline.
"""

from __future__ import annotations

import io
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from scaletrain import module_state
from scaletrain.fileio import open_regular

_crc32c: Any
try:  # a dependency of scaletrain; absent only from an install without dependencies
    import crc32c as _crc32c
except ImportError:  # pragma: no cover - then saves use zlib's CRC-32
    _crc32c = None

_FUNCTIONS: dict[str, Callable[[Any, int], int]] = {"crc32": zlib.crc32}
if _crc32c is not None:
    _FUNCTIONS["crc32c"] = lambda data, value: int(_crc32c.crc32c(data, value))
# The marker keys a load understands, preferred first
ALGORITHMS = ("crc32c", "crc32")
# What saves use: CRC-32C only where the CPU computes it (the package's software path is
# slower than zlib)
ALGORITHM = "crc32c" if _crc32c is not None and getattr(_crc32c, "hardware_based", False) \
    else "crc32"
_OVERLAP_BYTES = 1 << 20  # buffers at least this large: CRC beside the write, not before
# file_crc's read size: small enough to stay in the CPU's cache between the copy and the CRC
# (256 KiB ran fastest of 64 KiB-16 MiB here, benchmarks/checksum.py "verify")
_READ_BYTES = 1 << 18
_SPARE: bool | None = None  # decided at the first writer (see _spare_core)
module_state.register(__name__, "_SPARE")
# seconds spent computing checksums in this process (read by benchmarks/checkpoint.py)
crc_seconds = 0.0
module_state.register(__name__, "crc_seconds")


def _spare_core() -> bool:
    """Whether this process may count on a core of its own for the CRC thread: at least two
    usable cores per process of this node. Without one, the thread only adds switching (on
    2 cores shared by 2 ranks, handing each buffer over cost more than the CRC itself)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return cores >= 2 * local


def _crc(data: Any, value: int, algorithm: str | None = None) -> int:
    global crc_seconds
    t0 = time.perf_counter()
    out = _FUNCTIONS[algorithm or ALGORITHM](data, value)
    crc_seconds += time.perf_counter() - t0
    return out


def available(algorithm: str) -> bool:
    """Whether this Python can compute checksums of ``algorithm`` (a marker key)."""
    return algorithm in _FUNCTIONS


def recorded(marker: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(algorithm, {file: checksum}) of a commit marker; ("", {}) when it records none
    (checkpoints written before checksums existed: their sizes are checked)."""
    for name in ALGORITHMS:
        if isinstance(marker.get(name), dict):
            return name, marker[name]
    return "", {}


_zip_lock = threading.Lock()
_zip_users = 0
module_state.register(__name__, "_zip_users", leak=True)
_zip_before = True
module_state.register(__name__, "_zip_before")


@contextmanager
def our_crc_only() -> Iterator[None]:
    """Within the block, torch's zip writer computes no CRC-32 of its own per record.

    ``torch.save`` (and DCP, which calls it once per tensor) computes a CRC per zip record
    that ``torch.load`` never checks; ours covers the whole file and is checked, so theirs is
    a second pass over the same bytes for nothing (~20% of a ``torch.save`` here). torch's
    switch is process-wide: nested and concurrent blocks (our file thread beside DCP's) are
    counted, and the setting found before the first is put back after the last. A
    ``torch.save`` of the user's running meanwhile writes records without zip CRCs, which
    ``torch.load`` reads as before (only zip tools' ``testzip`` would notice).
    """
    from torch.serialization import get_crc32_options, set_crc32_options

    global _zip_users, _zip_before
    with _zip_lock:
        if _zip_users == 0:
            _zip_before = get_crc32_options()
            set_crc32_options(False)
        _zip_users += 1
    try:
        yield
    finally:
        with _zip_lock:
            _zip_users -= 1
            if _zip_users == 0:
                set_crc32_options(_zip_before)


def hex_crc(value: int) -> str:
    """The marker's spelling of a CRC: 8 lower-case hex digits."""
    return f"{value & 0xFFFFFFFF:08x}"


class ChecksumWriter:
    """A binary file object that passes every write on and keeps the CRC-32 of what passed.

    Only what torch.save and DCP's writer use is offered (write, tell, flush, fileno,
    close); a seek would invalidate the running CRC, so there is none.
    """

    def __init__(self, raw: Any) -> None:
        global _SPARE
        if _SPARE is None:
            _SPARE = _spare_core()
        self.raw = raw
        self.algorithm = ALGORITHM  # fixed for the file, whatever changes meanwhile
        self.crc = 0
        self.size = 0
        self._pool: ThreadPoolExecutor | None = None  # the CRC thread, ended by close()

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.nbytes >= _OVERLAP_BYTES and _SPARE:
            # the buffer stays valid until write() returns, and we wait for the CRC before
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scaletrain-crc")
            future: Future[int] = self._pool.submit(_crc, view, self.crc, self.algorithm)
            written = self.raw.write(view)
            self.crc = future.result()
        else:
            self.crc = _crc(view, self.crc, self.algorithm)
            written = self.raw.write(view)
        if written is not None and written != view.nbytes:  # a raw, unbuffered stream
            raise OSError(f"short write ({written} of {view.nbytes} bytes)")
        self.size += view.nbytes
        return view.nbytes

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def tell(self) -> int:
        return int(self.raw.tell())

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return int(self.raw.fileno())

    @property
    def closed(self) -> bool:
        return bool(self.raw.closed)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self.raw.close()

    def __enter__(self) -> ChecksumWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def file_crc(path: Path, algorithm: str | None = None) -> int:
    """The checksum of the file at ``path``, read in bounded ``read()`` calls.

    Not through a memory map: there, an I/O error of the disk (EIO) arrives as SIGBUS and
    kills the process without a word; a ``read()`` returns it as an ``OSError`` that the
    caller turns into "cannot be read" and a fall-back to the previous checkpoint.
    """
    view = memoryview(bytearray(_READ_BYTES))
    value = 0
    with open_regular(path) as fh:       # a pipe in a checkpoint folder is refused, not waited on
        raw = cast(io.BufferedReader, fh).raw  # unbuffered: one system call a chunk, no 2nd copy
        while n := raw.readinto(view):
            value = _crc(view[:n], value, algorithm)
    return value


def mismatch(path: Path, expected: Any, algorithm: str) -> str | None:
    """Why ``path`` does not match the ``algorithm`` checksum ``expected`` (the marker's hex
    string), or None."""
    if not isinstance(expected, str):
        return None  # checked by the marker's validation, not here
    if not available(algorithm):
        return (f"its {algorithm.upper()} checksum cannot be checked here: the crc32c package "
                "is missing (pip install crc32c)")
    try:
        actual = hex_crc(file_crc(path, algorithm))
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if actual != expected.lower():
        return (f"its checksum is {actual}, the commit marker says {expected} (the file "
                "changed after it was written)")
    return None


def first_mismatch(folder: Path, marker: dict[str, Any], names: Iterable[str]) -> str | None:
    """The first of ``names`` (files ``marker`` lists) whose bytes do not match its recorded
    checksum, as ``"file: why"``, or None. A file with no checksum recorded (a checkpoint written
    before checksums existed) is judged by its size, elsewhere."""
    algorithm, crcs = recorded(marker)
    for rel in names:
        if rel in crcs:
            why = mismatch(folder / rel, crcs[rel], algorithm)
            if why:
                return f"{rel}: {why}"
    return None


def checked_filesystem(crcs: dict[str, str]) -> Any:
    """A DCP ``FileSystem`` whose written files go through :class:`ChecksumWriter`.

    Each file's CRC lands in ``crcs`` under its name when DCP closes it (``.metadata`` is
    written as ``.metadata.tmp`` and renamed; the rename is followed here).
    """
    from torch.distributed.checkpoint.filesystem import FileSystem

    class CheckedFileSystem(FileSystem):
        @contextmanager
        def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
            if "w" not in mode:
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            with ChecksumWriter(Path(path).open(mode)) as stream:
                yield stream  # DCP closes it too (after its fsync); a second close is a no-op
                crcs[Path(path).name] = hex_crc(stream.crc)

        def rename(self, path: str | os.PathLike[str],
                   new_path: str | os.PathLike[str]) -> None:
            super().rename(path, new_path)
            old, new = Path(path).name, Path(new_path).name
            if old in crcs:
                crcs[new] = crcs.pop(old)

    return CheckedFileSystem()
