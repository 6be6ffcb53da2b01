"""``scaletrain logs``: a job's output across its requeued runs, optionally one rank's lines.

The output files are the run folder's ``*.out`` (what ``submit`` points ``--output`` at),
oldest first. A requeued job's runs follow each other in one file (the scripts write with
``--open-mode=append``), so reading the files in order shows every run. ``--rank N`` keeps the
lines a rank wrote with a prefix (``[rank N]`` from ``scaletrain run`` and
``scaletrain.print``, ``N:`` from ``srun --label``) and the unprefixed lines of the batch
shell are left out. ``--follow`` keeps printing what is appended until the job has ended.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable, Iterator, TextIO

from scaletrain.errors import UsageError
from scaletrain.jobs.runfolder import RunFolder, is_dir, open_run

_RANK = re.compile(r"^(?:\[rank (\d+)\] ?|\s*(\d+): )")
FOLLOW_POLL_S = 1.0


def rank_of(line: str) -> int | None:
    """The rank a line's prefix names, or None for an unprefixed line."""
    match = _RANK.match(line)
    if not match:
        return None
    return int(match.group(1) or match.group(2))


def _keep(line: str, rank: int | None) -> bool:
    return rank is None or rank_of(line) == rank


def log_files(run: RunFolder) -> list[Path]:
    """The run's output files, oldest first; ``UsageError`` when the folder has none yet."""
    if not is_dir(run.path):
        raise UsageError(f"no run folder {run.path}", "give a folder from 'scaletrain status'")
    return list(run.logs)


def read_lines(run_dir: str | Path, *, rank: int | None = None) -> Iterator[str]:
    """Every output line of the run (each file's lines in turn), filtered to ``rank``."""
    run = open_run(run_dir)
    for path in log_files(run):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines(keepends=True):
            if _keep(line, rank):
                yield line


def follow(run_dir: str | Path, out: TextIO, *, rank: int | None = None,
           finished: Callable[[], bool], poll: float = FOLLOW_POLL_S) -> None:
    """Print the output so far, then what is appended, until ``finished()`` says the job ended
    (a last read after that catches the final lines). New files (a new run) are picked up."""
    offsets: dict[Path, int] = {}
    partial: dict[Path, str] = {}
    done = False
    while True:
        run = open_run(run_dir)
        for path in log_files(run):
            try:
                with open(path, "rb") as fh:
                    fh.seek(offsets.get(path, 0))
                    data = fh.read()
                    offsets[path] = fh.tell()
            except OSError:
                continue
            text = partial.pop(path, "") + data.decode("utf-8", errors="replace")
            lines = text.splitlines(keepends=True)
            if lines and not lines[-1].endswith("\n") and not done:
                partial[path] = lines.pop()   # half a line: wait for the rest
            for line in lines:
                if _keep(line, rank):
                    out.write(line)
        out.flush()
        if done:
            return
        done = finished()
        if not done:
            time.sleep(poll)
