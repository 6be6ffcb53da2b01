"""Reading a checkpoint's files so that every byte torch deserializes was checked first.

A check and a load apart in time let a file that changes between them (a second job writing the
same folder, a file system serving a stale page) load unchecked. So nothing is read twice: a
:class:`VerifiedFile` is the file object ``torch.load`` (and DCP, through :func:`filesystem`)
reads from. Each read is served block by block (:data:`checksum.BLOCK_BYTES`), and a block is read
from the disk once: the part the caller asked for straight into the caller's memory (a tensor's
storage), the rest of the block into a buffer that is kept for the next read, and the block's
checksum is computed over those pieces before the call returns. The bytes torch gets are the
bytes that were checked, whatever the file holds later; only what a later read takes from the
kept buffer is copied twice (torch reads a record's header and then its data, in one block).

A checkpoint written before blocks were recorded has one checksum per file: its files are read
and checked whole, into memory, at their first read (their size, once per file open).

I/O goes through ``os.preadv`` on one descriptor: an error of the disk (EIO) is an ``OSError``,
never the SIGBUS a memory map would raise. :class:`Tracker` keeps which blocks a rank checked,
so that after the load it checks only the rest of its share of the files (the same verdict as
``layout.choose``, which checks whole files).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.checkpoint import checksum
from scaletrain.checkpoint.errors import CheckpointError
from scaletrain.fileio import open_regular

_STREAM_BYTES = 1 << 18  # a check of bytes nobody loads: 256 KiB reads into one small buffer


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


class VerifiedFile:
    """A read-only, seekable file object over ``path`` whose every byte handed out is checked.

    A block read in order (torch reads a file's records front to back) goes straight into the
    caller's memory and its checksum runs on there, continued by each next read of the block;
    a small gap between two reads (a record's name) is read and checked, never handed out. The
    block's verdict comes with the read that ends it, or at :meth:`close` (which reads the rest
    of a block begun): a load is not done before its files are closed. A read backwards, or far
    ahead, in a block (a zip directory at the end, torch's first look at the magic number)
    reads the whole block into a kept buffer, checked before anything of it is handed out, and
    checks that what went out before matches it. A mismatch raises :class:`Damaged` (kept in
    ``problem``: torch turns an exception of its reader into one of its own). ``expect`` None:
    a checkpoint without checksums, read as is.
    """

    def __init__(self, path: Path, expect: Expected | None, *, name: str,
                 checked: set[int] | None = None) -> None:
        self.name = name
        self.expect = expect
        self.problem: str | None = None
        self.checked = checked if checked is not None else set()   # blocks checked (a Tracker's)
        self._begun: dict[int, list[int]] = {}     # block -> [bytes checked in order, their CRC]
        self._cache: dict[int, memoryview] = {}    # the last two blocks read whole, checked
        self._spare: list[memoryview] = []
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
            index, into = divmod(self._pos + done, self.block)
            length = min(self.block, self.size - index * self.block)
            n = min(length - into, want - done)
            self._serve(index, into, length, view[done:done + n])
            done += n
        self._pos += want
        return want

    def close(self) -> None:
        """Finish the blocks begun (their verdict: :class:`Damaged`), then close the file."""
        try:
            for index in list(self._begun):
                if not self._fh.closed:
                    self._finish(index)
        finally:
            self._cache.clear()
            self._spare.clear()
            self._fh.close()

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def __enter__(self) -> VerifiedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.problem is not None:
            self._begun.clear()   # the verdict is in
        self.close()              # also after an error: damage read in order may be its cause

    # -- blocks ------------------------------------------------------------------------
    def _serve(self, index: int, into: int, length: int, part: memoryview) -> None:
        """``part`` from block ``index`` at ``into``: read in order, or from the kept block."""
        start = index * self.block
        if index not in self._cache:
            upto, value = self._begun.get(index, (0, 0))
            if index in self.checked or into < upto or into - upto > _STREAM_BYTES:
                self._keep(index, start, length, upto, value)    # out of order: whole, checked
            else:
                if into > upto:                                   # a small gap: checked, not handed out
                    gap = self._scratch[:into - upto]
                    self._read_at([gap], start + upto)
                    value = checksum.crc(gap, value, self.expect.algorithm)  # type: ignore[union-attr]
                self._read_at([part], start + into)
                value = checksum.crc(part, value, self.expect.algorithm)     # type: ignore[union-attr]
                self._begun[index] = [into + part.nbytes, value]
                if into + part.nbytes == length:
                    self._verdict(index, value, length)
                return
        part[:] = self._cache[index][into:into + part.nbytes]

    def _keep(self, index: int, start: int, length: int, upto: int, value: int) -> None:
        """Read block ``index`` whole into a kept buffer and check it, and that the ``upto``
        bytes handed out before (checksum ``value``) are the ones it holds."""
        buffer = self._buffer(length)
        self._read_at([buffer], start)
        actual = checksum.crc(buffer, 0, self.expect.algorithm)   # type: ignore[union-attr]
        self._begun.pop(index, None)
        self._verdict(index, actual, length)
        if upto and checksum.crc(buffer[:upto], 0, self.expect.algorithm) != value:  # type: ignore[union-attr]
            self._fail(f"block {index} changed while read (bytes 0-{upto} of it differ)")
        if len(self._cache) >= 2:
            self._spare.append(self._cache.pop(next(iter(self._cache))))
        self._cache[index] = buffer

    def _finish(self, index: int) -> None:
        """The rest of a block begun in order, read in small pieces, and its verdict."""
        upto, value = self._begun.pop(index)
        start = index * self.block
        length = min(self.block, self.size - start)
        for offset in range(upto, length, _STREAM_BYTES):
            piece = self._scratch[:min(_STREAM_BYTES, length - offset)]
            self._read_at([piece], start + offset)
            value = checksum.crc(piece, value, self.expect.algorithm)   # type: ignore[union-attr]
        self._verdict(index, value, length)

    def _verdict(self, index: int, actual: int, length: int) -> None:
        expect = self.expect
        assert expect is not None
        self._begun.pop(index, None)
        if actual != expect.crcs[index]:
            where = f"block {index} (bytes {index * self.block}-{index * self.block + length})" \
                if len(expect.crcs) > 1 else "its checksum"
            self._fail(f"{where}: {checksum.hex_crc(actual)}, the commit marker says "
                       f"{checksum.hex_crc(expect.crcs[index])} (the file changed after it was written)")
        self.checked.add(index)

    def _buffer(self, length: int) -> memoryview:
        """A block-sized buffer: one that left the cache, else a new one."""
        while self._spare:
            spare = self._spare.pop()
            if spare.nbytes >= length:
                return spare[:length]
        return memoryview(bytearray(length))

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
        self.problem = f"{self.name}: {why}"
        raise Damaged(self.problem)

    def verify_rest(self) -> None:
        """Check every block not checked yet (read in small pieces, nothing kept); raises
        :class:`Damaged` at the first mismatch."""
        if self.expect is None:
            return
        for index in range(len(self.expect.crcs)):
            if index not in self.checked:
                self._begun.setdefault(index, [0, 0])
                self._finish(index)


def problem_of(folder: Path, marker: dict[str, Any], rel: str, checked: set[int] | None = None) -> str | None:
    """Why ``rel`` does not match what ``marker`` records (``"file: why"``), or None; blocks in
    ``checked`` are not read again."""
    expect = expected(marker, rel)
    if expect is not None and not checksum.available(expect.algorithm):
        return (f"{rel}: its {expect.algorithm.upper()} checksum cannot be checked here: the crc32c "
                "package is missing (pip install crc32c)")
    try:
        with VerifiedFile(folder / rel, expect, name=rel, checked=set(checked or ())) as fh:
            fh.verify_rest()
    except Damaged as err:
        return err.problem
    except OSError as err:
        return f"{rel}: cannot be read ({err.strerror or err})"
    return None


def first_mismatch(folder: Path, marker: dict[str, Any], names: Iterable[str]) -> str | None:
    """The first of ``names`` (files ``marker`` lists) whose bytes do not match their recorded
    checksums, as ``"file: why"``, or None."""
    for rel in names:
        why = problem_of(folder, marker, rel)
        if why:
            return why
    return None


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
            raise Damaged(f"{path}: outside the checkpoint folder: refused") from None

    @contextmanager
    def open(self, rel: str) -> Iterator[VerifiedFile]:
        """``rel`` as a :class:`VerifiedFile`; a file the marker does not list is refused."""
        if rel not in self.marker["files"]:
            self.problem = self.problem or f"{rel}: not listed in the commit marker: refused"
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
