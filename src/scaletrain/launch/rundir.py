"""The run folder `scaletrain run` shares with its workers: who runs where, why a rank failed,
and every rank's Python stack after a hang.

Layout (``SCALETRAIN_RUN_DIR``; ``--run-dir``, else a temporary folder kept only when it holds
something worth reading)::

    ranks/rank-N.json    {"rank", "host", "pid", "thread", "attempt"}: written by the worker
                         entry when it can dump its stack on request (the consent to be signalled)
    errors/rank-N.json   a structured error: a ScaletrainError raised in the worker, or a
                         collective timeout with the ranks that did not arrive
    stacks/rank-N.txt    Python stacks of every thread, written on request after a hang
    finished/rank-N      written by the worker entry when the user's program has returned (or
                         exited 0): a crash after it happened while the interpreter shut down;
                         it lists the Python threads then alive ({"threads": [...]}), those the
                         interpreter's exit waits for among them

Both sides import this module; it imports neither torch nor anything that does. Every file is
written whole or not at all (:func:`scaletrain.fileio.atomic_write`), so the launcher never
reads half a record.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.contract.environ import AGENT_PID_VAR
from scaletrain.fileio import atomic_write, read_json_object

RANKS = "ranks"
ERRORS = "errors"
STACKS = "stacks"
FINISHED = "finished"


@dataclass(frozen=True, kw_only=True)
class RankInfo:
    """Where one worker runs and how to ask it for its stack."""

    rank: int
    host: str
    pid: int
    thread: int       # threading.get_ident() of its main thread (faulthandler prints it in hex)
    attempt: int = 0


@dataclass(frozen=True, kw_only=True)
class ErrorRecord:
    """Why a worker ended, in a form the launcher renders as one line and an exit code."""

    rank: int
    kind: str                 # "error" (a ScaletrainError) or "timeout" (a collective timed out)
    type: str                 # the exception class
    message: str
    hint: str = ""
    exit_code: int = 1
    where: str = ""           # "train.py:12 in main": the user's line that raised or waited
    attempt: int = 0
    missing: list[int] = field(default_factory=list)   # timeout: ranks that did not arrive


def _rank_file(run_dir: str | os.PathLike[str], sub: str, rank: int, suffix: str) -> Path:
    return Path(run_dir) / sub / f"rank-{rank}{suffix}"


def stack_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank``'s stack dump goes."""
    return _rank_file(run_dir, STACKS, rank, ".txt")


def write_rank_info(run_dir: str | os.PathLike[str], info: RankInfo) -> Path:
    """Publish where this worker runs (after its stack handler is installed)."""
    path = _rank_file(run_dir, RANKS, info.rank, ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(asdict(info), allow_nan=False))
    return path


def read_rank_infos(run_dir: str | os.PathLike[str]) -> dict[int, RankInfo]:
    """Every worker that published itself (on this node, or on all nodes of a shared folder)."""
    out: dict[int, RankInfo] = {}
    for path in sorted((Path(run_dir) / RANKS).glob("rank-*.json")):
        data = read_json_object(path)
        try:
            info = RankInfo(**data) if data is not None else None
        except TypeError:
            info = None
        if info is not None:
            out[info.rank] = info
    return out


# A process caught inside execve() shows an empty environment: the kernel closes the
# close-on-exec pipe that lets subprocess.Popen return *before* it lays out the new program's
# environment, so a child seen the moment it starts has none yet. It is asked again, briefly.
_EXEC_SETTLE_S = 1.0


def _environ_bytes(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read(1 << 22)   # 4 MiB: larger than any real environment
    except OSError:
        return None


_PF_KTHREAD = 0x00200000


def running(pid: int) -> bool:
    """A live user process: not ended (a zombie) and not a kernel thread (whose environment, like
    a zombie's, is empty for good)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[0] not in ("Z", "X") and not int(fields[6]) & _PF_KTHREAD
    except (OSError, IndexError, ValueError):
        return False


def environ_of(pid: int) -> list[bytes]:
    """The environment ``pid`` was started with (``NAME=VALUE`` items; empty when unreadable)."""
    data = _environ_bytes(pid)
    deadline = time.monotonic() + _EXEC_SETTLE_S
    while data == b"" and running(pid) and time.monotonic() < deadline:
        time.sleep(0.005)   # inside execve(): its environment appears within microseconds
        data = _environ_bytes(pid)
    return data.split(b"\0") if data else []


def started_by(pid: int, agent_pid: int) -> bool:
    """Whether ``pid`` is a worker of the launcher ``agent_pid``, or a process one started (it
    carries that ``SCALETRAIN_AGENT_PID``): a pid read from this folder may be anyone's by now
    (a program wrote over its record, or the pid was reused)."""
    return f"{AGENT_PID_VAR}={agent_pid}".encode() in environ_of(pid)


def write_error(run_dir: str | os.PathLike[str], record: ErrorRecord) -> Path:
    """Write ``record`` for the launcher (replaces an older one of the same rank)."""
    path = _rank_file(run_dir, ERRORS, record.rank, ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(asdict(record), allow_nan=False))
    return path


def read_errors(run_dir: str | os.PathLike[str] | None) -> dict[int, ErrorRecord]:
    """Every error record in the run folder, by rank (malformed ones are skipped)."""
    if not run_dir:
        return {}
    out: dict[int, ErrorRecord] = {}
    for path in sorted((Path(run_dir) / ERRORS).glob("rank-*.json")):
        data = read_json_object(path)
        try:
            record = ErrorRecord(**data) if data is not None else None
        except TypeError:
            record = None
        if record is not None:
            out[record.rank] = record
    return out


@dataclass(frozen=True, kw_only=True)
class ThreadInfo:
    """A Python thread of a worker whose program returned."""

    ident: int        # threading.get_ident(): how faulthandler names it (in hex)
    native_id: int    # the kernel's thread id: /proc/PID/task/NATIVE_ID
    name: str
    daemon: bool      # the interpreter's exit does not wait for a daemon thread


def write_finished(run_dir: str | os.PathLike[str], rank: int,
                   threads: list[ThreadInfo] | None = None) -> Path:
    """Mark that rank ``rank``'s program has returned: what follows is the interpreter's exit.
    ``threads``: the Python threads alive then, other than the main thread."""
    path = _rank_file(run_dir, FINISHED, rank, "")
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"threads": [asdict(t) for t in threads]} if threads is not None else {}
    atomic_write(path, json.dumps(record, allow_nan=False))
    return path


def read_exit_threads(run_dir: str | os.PathLike[str], rank: int) -> list[ThreadInfo] | None:
    """The threads rank ``rank`` had when its program returned (see :func:`write_finished`);
    None when it has not returned, or said nothing of them."""
    data = read_json_object(_rank_file(run_dir, FINISHED, rank, ""), errors="replace")
    items = data.get("threads") if data is not None else None
    if not isinstance(items, list):
        return None
    threads = []
    for item in items:
        try:
            thread = ThreadInfo(**item)
        except TypeError:
            continue
        if isinstance(thread.ident, int) and isinstance(thread.native_id, int):
            threads.append(thread)
    return threads


def read_finished(run_dir: str | os.PathLike[str] | None) -> set[int]:
    """The ranks whose program returned (see :func:`write_finished`)."""
    if not run_dir:
        return set()
    names = (p.name.removeprefix("rank-") for p in (Path(run_dir) / FINISHED).glob("rank-*")
             if p.is_file())
    return {int(n) for n in names if n.isdigit()}


def finished_pids(run_dir: str | os.PathLike[str]) -> set[int]:
    """The pids of the workers whose program has returned."""
    finished = read_finished(run_dir)
    return {info.pid for rank, info in read_rank_infos(run_dir).items() if rank in finished}


def clear_errors(run_dir: str | os.PathLike[str]) -> None:
    """Forget the records of a failed attempt (errors, finished marks) before the workers restart."""
    for path in [*(Path(run_dir) / ERRORS).glob("rank-*.json"),
                 *(Path(run_dir) / FINISHED).glob("rank-*")]:
        path.unlink(missing_ok=True)


def forget_ranks(run_dir: str | os.PathLike[str], ranks: list[int]) -> None:
    """Remove what an earlier run left for ``ranks`` in a folder used again (``--run-dir``): its
    workers' places, errors and finished marks would pass for this run's (a rank taken for
    finished while it trains, a pid that is no longer a worker's). Other ranks' files stay: on
    a folder shared by several nodes they are the other nodes' of this run."""
    for rank in ranks:
        for sub, suffix in ((RANKS, ".json"), (ERRORS, ".json"), (FINISHED, "")):
            path = _rank_file(run_dir, sub, rank, suffix)
            if path.is_symlink() or path.is_file():   # a folder of that name is no mark of ours
                path.unlink(missing_ok=True)


def has_stacks(run_dir: str | os.PathLike[str]) -> bool:
    """True when some rank's stack was dumped (a file that is not empty)."""
    return any(p.stat().st_size > 0 for p in (Path(run_dir) / STACKS).glob("rank-*.txt"))


def drop_empty_stacks(run_dir: str | os.PathLike[str]) -> None:
    """Remove the stack files no one wrote to (workers keep theirs open until they exit)."""
    for path in (Path(run_dir) / STACKS).glob("rank-*.txt"):
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except OSError:
            continue
