"""``scaletrain logs``: a job's output across its requeued runs, optionally one rank's lines.

The output files are the run folder's ``*.out`` (what ``submit`` points ``--output`` at),
oldest first. A requeued job's runs follow each other in one file (the scripts write with
``--open-mode=append``), so reading the files in order shows every run. ``--rank N`` keeps the
lines a rank wrote with a prefix (``[rank N]`` from ``scaletrain run`` and
``scaletrain.print``, ``N:`` from ``srun --label``) and the unprefixed lines of the batch
shell are left out. ``--follow`` keeps printing what is appended until the job has ended; a file emptied or
replaced meanwhile is read again from its start. Files are streamed (a MiB at a time), never held
whole, and a file that is not a regular one (a pipe, a device) is skipped with a note.
"""

from __future__ import annotations

import codecs
import os
import re
from pathlib import Path
from typing import IO, Callable, Iterator, TextIO

from scaletrain.errors import UsageError
from scaletrain.fileio import LINE_BYTES, open_regular
from scaletrain.jobs.runfolder import RunFolder, is_dir, open_run
from scaletrain.slurm.poll import poll_until

_RANK = re.compile(r"^(?:\[rank ([0-9]{1,7})\] ?|\s*([0-9]{1,7}): )")
FOLLOW_POLL_S = 1.0
FOLLOW_PATIENCE = 30     # unanswered state queries in a row before --follow gives up (minutes of silence)


def rank_of(line: str) -> int | None:
    """The rank a line's prefix names, or None for an unprefixed line."""
    match = _RANK.match(line)
    if not match:
        return None
    return int(match.group(1) or match.group(2))


class _Filter:
    """Keeps ``rank``'s lines; the pieces of a line longer than LINE_BYTES share its first piece's fate."""

    def __init__(self, rank: int | None) -> None:
        self.rank = rank
        self.at_start = True        # the previous piece ended a line
        self.keeping = True

    def __call__(self, piece: str) -> bool:
        if self.at_start:
            self.keeping = self.rank is None or rank_of(piece) == self.rank
        self.at_start = piece.endswith("\n")
        return self.keeping


def log_files(run: RunFolder) -> list[Path]:
    """The run's output files, oldest first; ``UsageError`` when the folder has none yet."""
    if not is_dir(run.path):
        raise UsageError(f"no run folder {run.path}", "give a folder from 'scaletrain status'")
    if not run.logs and run.job_id is None and run.script is None:
        raise UsageError(f"{run.path} holds no job: no job id, job script or output file in it",
                         "give a run folder 'scaletrain submit' made (listed by 'scaletrain status')")
    return list(run.logs)


def pieces(fh: IO[bytes], *, whole_lines: bool = True) -> Iterator[str]:
    """The file's lines as text, a line longer than LINE_BYTES in pieces (memory stays bounded);
    without ``whole_lines``, blocks of LINE_BYTES that may end mid-line (fast: nothing to filter)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        raw = fh.readline(LINE_BYTES) if whole_lines else fh.read(LINE_BYTES)
        if not raw:
            tail = decoder.decode(b"", final=True)
            if tail:
                yield tail
            return
        text = decoder.decode(raw)
        if text:
            yield text


def read_lines(run_dir: str | Path, *, rank: int | None = None,
               on_note: Callable[[str], None] | None = None) -> Iterator[str]:
    """The run's output (each file in turn, streamed), filtered to ``rank``'s lines; without
    ``rank`` it comes in blocks of up to LINE_BYTES, which need not end at a line's end.
    ``on_note`` hears what was left out (older files of a large array, a file that is not one)."""
    run = open_run(run_dir)
    files = log_files(run)
    for note in run.notes:
        if on_note is not None and "output files left out" in note:
            on_note(note)
    if not files and on_note is not None:
        on_note(f"no output yet: job {run.job_id or '(no id)'} has not written any in {run.path}")
    for path in files:
        try:
            fh = open_regular(path)
        except OSError as exc:
            if on_note is not None:
                on_note(f"{path.name} skipped: {exc.strerror}")
            continue
        keep = _Filter(rank)
        with fh:
            try:
                for piece in pieces(fh, whole_lines=rank is not None):
                    if keep(piece):
                        yield piece
            except OSError as exc:  # a read's: the caller's writes fail in the caller, not here
                if on_note is not None:
                    on_note(unreadable_note(path, fh, exc))


def unreadable_note(path: Path, fh: IO[bytes], exc: OSError) -> str:
    """The note for an output file whose reading failed part-way: named an error of reading
    (the disk's), never one of writing the output."""
    try:
        where = f" at byte {fh.tell()}"
    except (OSError, ValueError):
        where = ""
    return f"{path.name}: cannot read on{where}: {exc.strerror or exc}; the rest of it is not shown"


class _Tail:
    """Where ``follow`` is in each file: the offset read to, the file's identity, half a line."""

    def __init__(self, run_dir: str | Path, out: TextIO, rank: int | None,
                 on_note: Callable[[str], None] | None) -> None:
        self.run_dir, self.out, self.rank, self.on_note = run_dir, out, rank, on_note
        self.offsets: dict[Path, tuple[int, int]] = {}     # path -> (inode, offset)
        self.filters: dict[Path, _Filter] = {}
        self.skipped: set[Path] = set()

    def _note(self, text: str) -> None:
        if self.on_note is not None:
            self.on_note(text)

    def read_round(self, *, final: bool = False) -> None:
        """Print what each output file gained since the last round (``final``: half lines too)."""
        for path in log_files(open_run(self.run_dir)):
            try:
                fh = open_regular(path)
            except OSError as exc:
                if path not in self.skipped:
                    self.skipped.add(path)
                    self._note(f"{path.name} skipped: {exc.strerror}")
                continue
            with fh:
                self._read(path, fh, final)
        self.out.flush()

    def _read(self, path: Path, fh: IO[bytes], final: bool) -> None:
        st = os.fstat(fh.fileno())
        inode, offset = self.offsets.get(path, (st.st_ino, 0))
        if inode != st.st_ino or st.st_size < offset:
            self._note(f"{path.name} was {'replaced' if inode != st.st_ino else 'truncated'}: "
                       "reading it again from its start")
            offset = 0
            self.filters.pop(path, None)
        keep = self.filters.setdefault(path, _Filter(self.rank))
        fh.seek(offset)
        while True:
            try:
                raw = fh.readline(LINE_BYTES)
            except OSError as exc:
                if path not in self.skipped:
                    self.skipped.add(path)
                    self._note(unreadable_note(path, fh, exc))
                break
            if not raw or (not final and not raw.endswith(b"\n") and len(raw) < LINE_BYTES):
                break            # half a line: wait for the rest (a line's prefix names its rank)
            offset += len(raw)
            piece = raw.decode("utf-8", errors="replace")
            if keep(piece):
                self.out.write(piece)
        self.offsets[path] = (st.st_ino, offset)


def follow(run_dir: str | Path, out: TextIO, *, rank: int | None = None,
           finished: Callable[[], bool], poll: float = FOLLOW_POLL_S,
           on_note: Callable[[str], None] | None = None, patience: int = FOLLOW_PATIENCE) -> None:
    """Print the output so far, then what is appended, until ``finished()`` says the job ended
    (a last read after that catches the final lines). New files (a new run) are picked up.

    The rounds run in the one wait loop (:func:`scaletrain.slurm.poll.poll_until`): when
    ``finished`` raises ``SlurmError`` (Slurm did not answer) following goes on, said once
    through ``on_note``, for up to ``patience`` rounds in a row.
    """
    tail = _Tail(run_dir, out, rank, on_note)

    def one_round() -> bool:
        tail.read_round()
        return finished()

    poll_until(one_round, bool, timeout=None, poll=poll, patience=patience, on_note=on_note)
    tail.read_round(final=True)
