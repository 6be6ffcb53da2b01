"""Checksums of checkpoint files: computed while the file is written, checked before it is read.

A flipped byte in a checkpoint must never load silently (torch reads zip records without
checking their CRCs). Every file of a save goes through :class:`ChecksumWriter`, which updates a
checksum with each buffer on its way to the file, so nothing is read back. It keeps one checksum
per :data:`BLOCK_BYTES` of the file as well: the commit marker records the whole file's under the
algorithm's name (``"crc32c": {"replicated.pt": "1a2b3c4d", ...}``) beside the sizes, and the
blocks' under ``"blocks"``, so that a load checks every byte it hands to torch on its way from
the disk, block by block, and reads no byte twice (:mod:`scaletrain.checkpoint.verified`). The
whole file's checksum is folded from the blocks' (:func:`combine`, no second pass).

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

import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

from scaletrain import module_state

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
# The unit of verification: each 4 MiB of a file has its own checksum, so a rank that needs a few
# bytes of another rank's shard (DCP spreads replicated entries over every rank's file) reads and
# checks 4 MiB of it, not the whole file; 262,144 blocks (8 hex digits each) make 1 TB of checkpoint
BLOCK_BYTES = 4 << 20
# the polynomials (bit-reversed) for combining checksums, as zlib's crc32_combine does
_POLY = {"crc32": 0xEDB88320, "crc32c": 0x82F63B78}
_OVERLAP_BYTES = 1 << 20
_SMALL_BYTES = 1 << 16   # writes below this are gathered...
_BATCH_BYTES = 1 << 20   # ...and passed on this many bytes at a time  # buffers at least this large: CRC beside the write, not before
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


def crc(data: Any, value: int, algorithm: str) -> int:
    """The ``algorithm`` checksum of ``data`` continued from ``value`` (0 to start)."""
    return _crc(data, value, algorithm)


def _multmodp(a: int, b: int, poly: int) -> int:
    """a times b modulo the polynomial (zlib's multmodp, bit-reversed)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ poly if b & 1 else b >> 1


@lru_cache(maxsize=None)
def _powers(poly: int) -> tuple[int, ...]:
    """x^(2^k) modulo the polynomial, k = 0..31."""
    p, out = 1 << 30, [1 << 30]
    for _ in range(31):
        p = _multmodp(p, p, poly)
        out.append(p)
    return tuple(out)


@lru_cache(maxsize=64)
def _shift(length: int, poly: int) -> int:
    """x^(8 * length) modulo the polynomial: what appending ``length`` bytes does to a CRC."""
    table, p, k = _powers(poly), 1 << 31, 3
    while length:
        if length & 1:
            p = _multmodp(table[k & 31], p, poly)
        length >>= 1
        k += 1
    return p


def combine(first: int, second: int, length: int, algorithm: str) -> int:
    """The checksum of A followed by B from A's, B's and B's length (zlib's crc32_combine)."""
    poly = _POLY[algorithm]
    return _multmodp(_shift(length, poly), first, poly) ^ second


def block_count(size: int, block: int) -> int:
    """How many checksums a file of ``size`` bytes has in blocks of ``block`` (an empty file: one)."""
    return max(1, -(-size // block))


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
    """A binary file object that passes every write on and keeps the checksums of what passed:
    one per :data:`BLOCK_BYTES` (``blocks``) and the whole file's (``crc``, folded from them).

    Only what torch.save and DCP's writer use is offered (write, tell, flush, fileno,
    close); a seek would invalidate the running CRC, so there is none. Small writes (a zip
    record's header: DCP writes ~5,400 of them per 290 MB) are gathered and passed on, and
    checksummed, :data:`_BATCH_BYTES` at a time: per write, a Python call each to the CRC and
    to the file cost more than the CRC of the bytes.
    """

    def __init__(self, raw: Any) -> None:
        global _SPARE
        if _SPARE is None:
            _SPARE = _spare_core()
        self.raw = raw
        self.algorithm = ALGORITHM  # fixed for the file, whatever changes meanwhile
        self.blocks: list[int] = []   # the checksum of each whole block written so far
        self._open = 0               # the checksum of the block being filled, and its bytes
        self._filled = 0
        self.size = 0
        self._pool: ThreadPoolExecutor | None = None  # the CRC thread, ended by close()
        self._small = bytearray()     # small writes not passed on yet

    def _update(self, view: memoryview) -> None:
        """The checksums of ``view``, cut at block boundaries."""
        while view.nbytes:
            take = min(view.nbytes, BLOCK_BYTES - self._filled)
            self._open = _crc(view[:take], self._open, self.algorithm)
            self._filled += take
            view = view[take:]
            if self._filled == BLOCK_BYTES:
                self.blocks.append(self._open)
                self._open = self._filled = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes < _SMALL_BYTES:
            self._small += view
            if len(self._small) >= _BATCH_BYTES:
                self._drain()
            self.size += view.nbytes
            return view.nbytes
        self._drain()
        self._pass(view)
        self.size += view.nbytes
        return view.nbytes

    def _drain(self) -> None:
        """Pass the gathered small writes on (checksummed)."""
        if self._small:
            with memoryview(self._small) as view:
                self._pass(view)
            self._small.clear()

    def _pass(self, view: memoryview) -> None:
        if view.nbytes >= _OVERLAP_BYTES and _SPARE:
            # the buffer stays valid until write() returns, and we wait for the CRC before
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scaletrain-crc")
            future: Future[None] = self._pool.submit(self._update, view)
            written = self.raw.write(view)
            future.result()
        else:
            self._update(view)
            written = self.raw.write(view)
        if written is not None and written != view.nbytes:  # a raw, unbuffered stream
            raise OSError(f"short write ({written} of {view.nbytes} bytes)")

    def block_crcs(self) -> list[int]:
        """Every block's checksum, the last (partial, or an empty file's) included."""
        self._drain()
        return self.blocks + [self._open] if self._filled or not self.blocks else list(self.blocks)

    @property
    def crc(self) -> int:
        """The whole file's checksum so far, folded from the blocks' (no second pass)."""
        blocks = self.block_crcs()
        whole = blocks[0]
        for i, value in enumerate(blocks[1:], start=1):
            length = BLOCK_BYTES if i < len(blocks) - 1 or not self._filled else self._filled
            whole = combine(whole, value, length, self.algorithm)
        return whole

    def block_hex(self) -> str:
        """The blocks' checksums as the marker spells them: 8 hex digits each, end to end."""
        return "".join(hex_crc(value) for value in self.block_crcs())

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def tell(self) -> int:
        return int(self.raw.tell()) + len(self._small)

    def flush(self) -> None:
        self._drain()
        self.raw.flush()

    def fileno(self) -> int:
        self.flush()   # an fsync of it must cover every byte written so far
        return int(self.raw.fileno())

    @property
    def closed(self) -> bool:
        return bool(self.raw.closed)

    def close(self) -> None:
        try:
            if not self.raw.closed:
                self._drain()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            self.raw.close()

    def __enter__(self) -> ChecksumWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def checked_filesystem(crcs: dict[str, tuple[str, str]]) -> Any:
    """A DCP ``FileSystem`` whose written files go through :class:`ChecksumWriter`.

    Each file's checksums (the whole file's, the blocks') land in ``crcs`` under its name when
    DCP closes it (``.metadata`` is written as ``.metadata.tmp`` and renamed; the rename is
    followed here).
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
                crcs[Path(path).name] = (hex_crc(stream.crc), stream.block_hex())

        def rename(self, path: str | os.PathLike[str],
                   new_path: str | os.PathLike[str]) -> None:
            super().rename(path, new_path)
            old, new = Path(path).name, Path(new_path).name
            if old in crcs:
                crcs[new] = crcs.pop(old)

    return CheckedFileSystem()
