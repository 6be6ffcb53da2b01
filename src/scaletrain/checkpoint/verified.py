"""Reading a checkpoint's files so that what torch deserializes is what was checked.

A check and a load apart in time let a file that changes between them (a second job writing the
same folder, a file system serving a stale page) load unchecked. So nothing is read twice: a
:class:`VerifiedFile` is the file object ``torch.load`` (and DCP, through :func:`filesystem`)
reads from: each read goes from the disk straight into the caller's memory (a tensor's storage),
once, and the block's checksum (:data:`checksum.BLOCK_BYTES`) is computed from what was handed
out, in the caller's memory, and the bytes between (read then, never handed out). The verdict
is on the bytes torch got, whatever the file holds later; it comes when a block is covered, or
when the file is closed, before the load counts.

A checkpoint written before blocks were recorded has one checksum per file: the file is one block.

I/O goes through ``os.preadv`` on one descriptor: an error of the disk (EIO) is an ``OSError``,
never the SIGBUS a memory map would raise. :class:`Tracker` keeps which blocks a rank checked,
so that after the load it checks only the rest of its share of the files (the same verdict as
``layout.choose``, which checks whole files).
"""

from __future__ import annotations

import bisect
import operator
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.checkpoint import checksum
from scaletrain.checkpoint.errors import CheckpointError
from scaletrain.checkpoint.marker import shown
from scaletrain.fileio import open_regular

_STREAM_BYTES = 1 << 18  # a check of bytes nobody loads: 256 KiB reads into one small buffer
_SMALL_PIECE = 1 << 16   # a piece handed out up to this size is remembered by its bytes


class Damaged(CheckpointError):
    """A file's bytes are not those its commit marker records; ``problem`` is ``"file: why"``."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem, hint="the file changed after it was written")
        self.problem = problem


@dataclass(frozen=True, kw_only=True)
class Expected:
    """What the commit marker records of one file."""

    size: int
    algorithm: str
    block: int                 # bytes per checksum (a file's size or more: one for the whole file)
    crcs: tuple[int, ...]


def expected(marker: dict[str, Any], rel: str) -> Expected | None:
    """What a (validated) ``marker`` records of ``rel``; None when it records no checksum (a
    checkpoint written before checksums existed: its sizes are checked, elsewhere)."""
    algorithm, crcs = checksum.recorded(marker)
    if rel not in crcs:
        return None
    size = marker["files"][rel]
    blocks = marker.get("blocks")
    text = blocks.get(algorithm, {}).get(rel) if isinstance(blocks, dict) else None
    if isinstance(blocks, dict) and isinstance(text, str):
        return Expected(size=size, algorithm=algorithm, block=blocks["bytes"],
                        crcs=tuple(int(text[i:i + 8], 16) for i in range(0, len(text), 8)))
    return Expected(size=size, algorithm=algorithm, block=max(size, 1), crcs=(int(crcs[rel], 16),))


_start = operator.itemgetter(0)   # a piece's first offset: pieces are kept sorted by it
class VerifiedFile:
    """A read-only, seekable file object over ``path`` that checks every byte it hands out.

    Each read goes from the disk straight into the caller's memory (a tensor's storage), once.
    What a read handed out of a block is remembered: its bytes when small (a zip header, a
    pickle), its checksum, taken there in the caller's memory, when large (a tensor's data).
    When a block's pieces cover it, or when the file is closed (the rest of a begun block read
    then, never handed out), they are combined into the block's checksum (``checksum.combine``)
    and compared with the marker's: the verdict on the very bytes handed out, whatever the file
    holds later, in whatever order torch read them (a zip's directory at its end first). A load
    is not done before its files are closed. A read that overlaps a large piece handed out
    before (torch reading the same data twice: rare) reads the block whole, checks it and what
    went out before, and keeps it. A mismatch raises :class:`Damaged` (kept in ``problem``:
    torch turns an exception of its reader into one of its own). ``expect`` None: a checkpoint
    without checksums, read as is.
    """

    def __init__(self, path: Path, expect: Expected | None, *, name: str,
                 checked: set[int] | None = None) -> None:
        self.name = name
        self.expect = expect
        self.problem: str | None = None
        self.checked = checked if checked is not None else set()   # blocks checked (a Tracker's)
        # block -> the pieces handed out, disjoint and sorted: (start, end, bytes or checksum)
        self._pieces: dict[int, list[tuple[int, int, bytes | int]]] = {}
        self._covered: dict[int, int] = {}         # block -> bytes its pieces cover
        self._kept: dict[int, memoryview] = {}     # blocks read whole and checked (the last two)
        self._scratch = memoryview(bytearray(_STREAM_BYTES))
        self._pos = 0
        self._fh = open_regular(path)            # a pipe or device is refused, not waited on
        self.size = os.fstat(self._fh.fileno()).st_size
        self.block = expect.block if expect is not None else max(self.size, 1)
        if expect is not None and self.size != expect.size:
            self._fh.close()
            self._fail(f"has {self.size} bytes, the commit marker says {expect.size} (truncated?)")

    # -- the file object torch reads -------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise OSError(f"{self.name}: seek before the start")
        self._pos = base + offset
        return self._pos

    def read(self, size: int = -1) -> bytes:
        size = self.size - self._pos if size is None or size < 0 else size
        buffer = bytearray(max(0, min(size, self.size - self._pos)))
        return bytes(buffer[:self.readinto(buffer)])

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = max(0, min(view.nbytes, self.size - self._pos))
        if self.expect is None:
            self._read_at([view[:want]], self._pos)
        done = want if self.expect is None else 0
        while done < want:
            index = (self._pos + done) // self.block
            end = min((index + 1) * self.block, self._pos + want)
            self._serve(index, self._pos + done, view[done:end - self._pos])
            done = end - self._pos
        self._pos += want
        return want

    def close(self) -> None:
        """Judge the blocks begun (:class:`Damaged`), then close the file."""
        try:
            for index in list(self._pieces):
                if not self._fh.closed:
                    self._judge(index)
        finally:
            self._pieces.clear()
            self._kept.clear()
            self._fh.close()

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def __enter__(self) -> VerifiedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.problem is not None:
            self._pieces.clear()   # the verdict is in
        self.close()               # also after an error: damage may be its cause

    # -- blocks ------------------------------------------------------------------------
    def _bounds(self, index: int) -> tuple[int, int]:
        return index * self.block, min((index + 1) * self.block, self.size)

    def _serve(self, index: int, at: int, part: memoryview) -> None:
        """``part`` (file offset ``at``, inside block ``index``) read and remembered."""
        start, _ = self._bounds(index)
        kept = self._kept.get(index)
        if kept is None and index in self.checked and index not in self._pieces:
            kept = self._keep(index)                         # read again after its verdict
        if kept is not None:
            part[:] = kept[at - start:at - start + part.nbytes]
            return
        self._read_at([part], at)
        pieces = self._pieces.setdefault(index, [])
        new: list[tuple[int, int, bytes | int]] = []
        pos, end = at, at + part.nbytes
        i = max(0, bisect.bisect_right(pieces, at, key=_start) - 1)   # the pieces it may overlap
        while i < len(pieces) and pieces[i][0] < end:
            a, b, held = pieces[i]
            i += 1
            if b <= pos:
                continue
            if not isinstance(held, bytes):                  # over a large piece: whole, checked
                self._keep(index, extra=(at, part))
                return
            lo, hi = max(a, pos), min(b, end)
            if held[lo - a:hi - a] != part[lo - at:hi - at]:
                self._fail(f"bytes {lo}-{hi} changed while read")
            if lo > pos:
                new.append(self._piece(part, at, pos, lo))
            pos = max(pos, hi)
        if pos < end:
            new.append(self._piece(part, at, pos, end))
        for piece in new:
            bisect.insort(pieces, piece, key=_start)
        covered = self._covered.get(index, 0) + sum(b - a for a, b, _ in new)
        self._covered[index] = covered
        if covered == self._bounds(index)[1] - start:
            self._judge(index)                               # covered: the verdict now

    def _piece(self, part: memoryview, at: int, lo: int, hi: int) -> tuple[int, int, bytes | int]:
        data = part[lo - at:hi - at]
        if data.nbytes <= _SMALL_PIECE:
            return (lo, hi, bytes(data))
        return (lo, hi, checksum.crc(data, 0, self.expect.algorithm))  # type: ignore[union-attr]

    def _judge(self, index: int) -> None:
        """Block ``index``'s checksum from its pieces and the bytes between them (read now,
        never handed out), against the marker's."""
        algorithm = self.expect.algorithm  # type: ignore[union-attr]
        start, stop = self._bounds(index)
        value, pos = 0, start
        self._covered.pop(index, None)
        for a, b, held in self._pieces.pop(index, []) + [(stop, stop, b"")]:
            for offset in range(pos, a, _STREAM_BYTES):
                gap = self._scratch[:min(_STREAM_BYTES, a - offset)]
                self._read_at([gap], offset)
                value = checksum.crc(gap, value, algorithm)
            value = checksum.crc(held, value, algorithm) if isinstance(held, bytes) else \
                checksum.combine(value, held, b - a, algorithm)
            pos = b
        self._verdict(index, value)

    def _keep(self, index: int, extra: tuple[int, memoryview] | None = None) -> memoryview:
        """Block ``index`` read whole and checked, kept; what went out of it before (and
        ``extra``: a part just read at an offset) must be what it holds."""
        start, stop = self._bounds(index)
        buffer = memoryview(bytearray(stop - start))
        self._read_at([buffer], start)
        self._verdict(index, checksum.crc(buffer, 0, self.expect.algorithm))  # type: ignore[union-attr]
        went = self._pieces.pop(index, [])
        self._covered.pop(index, None)
        for a, b, held in went:
            same = held == buffer[a - start:b - start] if isinstance(held, bytes) else \
                held == checksum.crc(buffer[a - start:b - start], 0, self.expect.algorithm)  # type: ignore[union-attr]
            if not same:
                self._fail(f"bytes {a}-{b} changed while read")
        if extra is not None:
            at, part = extra
            part[:] = buffer[at - start:at - start + part.nbytes]   # the checked bytes, not those
        if len(self._kept) >= 2:
            self._kept.pop(next(iter(self._kept)))
        self._kept[index] = buffer
        return buffer

    def _verdict(self, index: int, actual: int) -> None:
        expect = self.expect
        assert expect is not None
        if actual != expect.crcs[index]:
            start, stop = self._bounds(index)
            where = f"block {index} (bytes {start}-{stop}): " if len(expect.crcs) > 1 else ""
            self._fail(f"{where}its checksum is {checksum.hex_crc(actual)}, the commit marker says "
                       f"{checksum.hex_crc(expect.crcs[index])} (the file changed after it was written)")
        self.checked.add(index)

    def _read_at(self, pieces: list[memoryview], offset: int) -> None:
        """Fill ``pieces`` (in order) from the file at ``offset``: one system call where it can."""
        pieces = [p for p in pieces if p.nbytes]
        got = 0
        while pieces:
            n = os.preadv(self._fh.fileno(), pieces, offset + got)
            if n == 0:
                self._fail(f"ended after {offset + got} bytes while read (the commit marker says "
                           f"{self.size}): it changed while read")
            got += n
            while pieces and n >= pieces[0].nbytes:
                n -= pieces.pop(0).nbytes
            if n:
                pieces[0] = pieces[0][n:]

    def _fail(self, why: str) -> None:
        self.problem = f"{shown(self.name)}: {why}"
        raise Damaged(self.problem)

    def verify_rest(self) -> None:
        """Check every block not checked yet (read in small pieces, nothing kept); raises
        :class:`Damaged` at the first mismatch."""
        if self.expect is None:
            return
        for index in range(len(self.expect.crcs)):
            if index not in self.checked:
                self._judge(index)


def problem_of(folder: Path, marker: dict[str, Any], rel: str, checked: set[int] | None = None) -> str | None:
    """Why ``rel`` does not match what ``marker`` records (``"file: why"``), or None; blocks in
    ``checked`` are not read again."""
    expect = expected(marker, rel)
    if expect is not None and not checksum.available(expect.algorithm):
        return (f"{shown(rel)}: its {expect.algorithm.upper()} checksum cannot be checked here: the crc32c "
                "package is missing (pip install crc32c)")
    try:
        with VerifiedFile(folder / rel, expect, name=rel, checked=set(checked or ())) as fh:
            fh.verify_rest()
    except Damaged as err:
        return err.problem
    except OSError as err:
        return f"{shown(rel)}: cannot be read ({err.strerror or err})"
    return None


def first_mismatch(folder: Path, marker: dict[str, Any], names: Iterable[str]) -> str | None:
    """The first of ``names`` (files ``marker`` lists) whose bytes do not match their recorded
    checksums, as ``"file: why"``, or None."""
    return next((why for why in (problem_of(folder, marker, rel) for rel in names) if why), None)


def file_crc(path: Path, algorithm: str | None = None) -> int:
    """The checksum of the whole file at ``path`` (bounded ``read()`` calls, no memory map)."""
    with VerifiedFile(path, None, name=path.name) as fh:
        scratch, value = memoryview(bytearray(_STREAM_BYTES)), 0
        for offset in range(0, fh.size, _STREAM_BYTES):
            piece = scratch[:min(_STREAM_BYTES, fh.size - offset)]
            fh._read_at([piece], offset)
            value = checksum.crc(piece, value, algorithm or checksum.ALGORITHM)
    return value


class Tracker:
    """One rank's reads of one checkpoint: the files it opened, the blocks it checked, and the
    first mismatch any of them found."""

    def __init__(self, folder: Path, marker: dict[str, Any]) -> None:
        self.folder = folder
        self.marker = marker
        self.checked: dict[str, set[int]] = {}
        self.problem: str | None = None
        self._lock = threading.Lock()

    def rel(self, path: str | os.PathLike[str]) -> str:
        """``path``'s name inside the checkpoint folder; :class:`Damaged` for one outside it."""
        try:
            return Path(path).relative_to(self.folder).as_posix()
        except ValueError:
            raise Damaged(f"{shown(str(path))}: outside the checkpoint folder: refused") from None

    @contextmanager
    def open(self, rel: str) -> Iterator[VerifiedFile]:
        """``rel`` as a :class:`VerifiedFile`; a file the marker does not list is refused."""
        if rel not in self.marker["files"]:
            self.problem = self.problem or f"{shown(rel)}: not listed in the commit marker: refused"
            raise Damaged(self.problem)
        with self._lock:
            checked = self.checked.setdefault(rel, set())
        try:
            with VerifiedFile(self.folder / rel, expected(self.marker, rel), name=rel,
                              checked=checked) as fh:
                yield fh
        except Damaged as err:
            self.problem = self.problem or err.problem
            raise

    def finish(self, share: Iterable[str]) -> str | None:
        """After the load: the first problem found, else the first among the blocks of
        ``share`` that this rank's load did not check."""
        if self.problem is not None:
            return self.problem
        for rel in share:
            expect = expected(self.marker, rel)
            if expect is not None and len(self.checked.get(rel, ())) == len(expect.crcs):
                continue   # read whole by the load: not opened again
            self.problem = problem_of(self.folder, self.marker, rel, self.checked.get(rel))
            if self.problem:
                break
        return self.problem


def filesystem(tracker: Tracker) -> Any:
    """A DCP ``FileSystem`` whose reads go through ``tracker`` (writes as DCP's own)."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class VerifiedFileSystem(FileSystem):
        @contextmanager
        def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
            if "r" not in mode or "+" in mode:
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            with tracker.open(tracker.rel(path)) as stream:
                yield stream

    return VerifiedFileSystem()
