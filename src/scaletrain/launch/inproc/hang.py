"""Hang forensics in a worker: stacks on request, and who did not arrive at a timed-out collective.

A collective that times out raises on the ranks that *waited* (gloo: "Timed out waiting
5000ms for recv operation"); the rank that never arrived raises nothing, so torch's message
names the wrong rank. When a collective times out here, this rank asks every worker of its
node (the ones that published themselves in the run folder) to dump its Python stacks with
``faulthandler`` - a C-level handler, so it answers even when the rank is blocked in C code -
and reads them: a rank whose main thread sits inside torch.distributed/autograd waits in a
collective too; a rank elsewhere (a ``time.sleep``, a data-loading loop, a deadlock in user
code) is the one that did not arrive. Ranks on other nodes are named as unknown when no rank
of this node is to blame (their own node's stacks are dumped by their own ranks' timeouts).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import re
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from scaletrain import module_state
from scaletrain.contract.environ import AGENT_PID_VAR
from scaletrain.fileio import READ_LIMIT
from scaletrain.launch import frames, rundir

# Frames of these torch subpackages mean "waiting on other ranks" (collectives, DDP/FSDP hooks in
# backward); recognised by torch's real folder, never by words in a path (see launch/frames.py)
_TORCH_WAITING = (("distributed",), ("autograd",), ("nn", "parallel"))
_TIMEOUT_RE = re.compile(r"timed out|timeout", re.IGNORECASE)
_MS_RE = re.compile(r"Timed out waiting (\d+)\s*ms", re.IGNORECASE)
_DUMP_WAIT_S = 3.0
_ENABLED_BY_US: set[str] = set()  # stack files faulthandler.enable() writes to
module_state.register(__name__, "_ENABLED_BY_US")


def stack_signal() -> int | None:
    """The signal that asks a worker for its stacks: a real-time one no launcher or library
    uses (USR1/USR2/TERM are the stop signals). None where the platform has none."""
    base = getattr(signal, "SIGRTMIN", None)
    return int(base) + 3 if base is not None else None


def _ignore(sig: int) -> None:
    """Ignore ``sig`` at the kernel's level, before faulthandler's handler is installed over it:
    faulthandler puts back what it found when the interpreter's exit removes its handler, and
    a request arriving after that must not kill the process (a real-time signal's default
    action is to terminate). Through libc, not ``signal.signal``: Python's own handler table
    stays as it was (the program, and a test's hygiene check, see no handler of ours)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(ctypes.c_int(sig), ctypes.c_void_p(1))   # 1 is SIG_IGN on Linux
    except (OSError, AttributeError):  # no libc to ask: the launcher checks before it asks
        pass


def install_stack_dump(run_dir: str, rank: int, attempt: int) -> IO[str] | None:
    """Let the launcher or a peer ask this process for its stacks; publish where it runs.

    Returns the open stack file (kept open for faulthandler; closed and removed at exit when
    empty), or None when the platform has no spare signal or the folder is not writable.
    """
    sig = stack_signal()
    if sig is None:
        return None
    path = rundir.stack_path(run_dir, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a", encoding="utf-8")  # append: an earlier attempt's dump stays
        _ignore(sig)
        faulthandler.register(sig, file=fh, all_threads=True, chain=False)
        if not faulthandler.is_enabled():  # a user's own setting wins
            # a fatal signal (SIGSEGV, an abort from NCCL's watchdog) leaves this rank's stack
            faulthandler.enable(file=fh, all_threads=True)
            _ENABLED_BY_US.add(fh.name)
        rundir.write_rank_info(run_dir, rundir.RankInfo(
            rank=rank, host=socket.gethostname(), pid=os.getpid(),
            thread=threading.main_thread().ident or 0, attempt=attempt))
    except (OSError, ValueError):  # not writable; or not the main thread
        return None
    return fh


def remove_if_empty(fh: IO[str] | None, *, keep_handler: bool = False) -> None:
    """At a normal exit: drop the stack file nobody asked for. ``keep_handler``: the program
    returned, and the interpreter's exit still lies ahead, which may hang in torch's teardown
    (:mod:`scaletrain.launch.teardown` asks for the stack then); the handlers and the file
    stay, and the launcher drops the file if it stays empty (:func:`rundir.drop_empty_stacks`)."""
    if fh is None or keep_handler:
        return
    sig = stack_signal()
    if sig is not None:
        faulthandler.unregister(sig)
    if fh.name in _ENABLED_BY_US:
        faulthandler.disable()
        _ENABLED_BY_US.discard(fh.name)
    try:
        fh.close()
        if os.path.getsize(fh.name) == 0:
            os.unlink(fh.name)
    except OSError:
        pass


def is_collective_timeout(exc: BaseException) -> bool:
    """True for the error torch raises when a collective waited past its timeout."""
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    return bool(_TIMEOUT_RE.search(text)) and "closed by peer" not in text


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    func: str

    @property
    def waiting(self) -> bool:
        return any(frames.in_package(self.path, "torch", *sub) for sub in _TORCH_WAITING)

    def short(self) -> str:
        return f"{_short_path(self.path)}:{self.line} in {self.func}"


def _short_path(path: str) -> str:
    return frames.short_path(path)


_FRAME_RE = re.compile(r'^\s*File "(?P<path>.*)", line (?P<line>\d+) in (?P<func>.*)$')


_THREAD_RE = re.compile(r"^(?:Current thread|Thread) 0x(?P<ident>[0-9a-fA-F]+)")


def _stacks(text: str) -> dict[int, list[Frame]]:
    """Every thread of a faulthandler dump (by ident) and its frames, innermost first; a thread
    dumped twice keeps the newest, which comes last."""
    out: dict[int, list[Frame]] = {}
    for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", text):
        lines = block.strip().splitlines()
        head = _THREAD_RE.match(lines[0]) if lines else None
        if head is not None:
            out[int(head["ident"], 16)] = [Frame(m["path"], int(m["line"]), m["func"])
                                            for m in map(_FRAME_RE.match, lines[1:]) if m]
    return out


def thread_frames(text: str) -> dict[int, Frame | None]:
    """Every thread of a faulthandler dump (by ident) and its innermost frame (None: no Python
    frame)."""
    return {ident: (stack[0] if stack else None) for ident, stack in _stacks(text).items()}


def thread_places(text: str) -> dict[int, str | None]:
    """Every thread of a faulthandler dump (by ident) and where it is, as a user reads it: its
    innermost frame in the program's own files, and the innermost frame where that is elsewhere
    (``train.py:64 in upload, inside subprocess.py:1264 in wait``); None: no Python frame."""
    out: dict[int, str | None] = {}
    for ident, stack in _stacks(text).items():
        own = next((f for f in stack if frames.is_program_file(f.path)), None)
        if not stack:
            out[ident] = None
        elif own is None or own == stack[0]:
            out[ident] = stack[0].short()
        else:
            out[ident] = f"{own.short()}, inside {stack[0].short()}"
    return out


def main_thread_frame(text: str, thread: int) -> Frame | None:
    """The innermost frame of thread ``thread`` in a faulthandler dump (None if absent)."""
    return thread_frames(text).get(thread)


def _innermost(tb: Any, *, waiting: bool) -> Frame | None:
    """The innermost frame of a traceback inside torch (waiting) or outside it (the user's)."""
    frames = [Frame(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(tb)]
    for frame in reversed(frames):
        if frame.waiting == waiting:
            return frame
    return None


_Asked = dict[int, tuple[rundir.RankInfo, Path, int]]


def _request_stacks(run_dir: str, skip: set[int],
                    infos: dict[int, rundir.RankInfo] | None = None) -> _Asked:
    """Signal every worker of this host not in ``skip`` (of ``infos``, else of the run folder);
    rank -> (info, stack file, old size)."""
    sig = stack_signal()
    host = socket.gethostname()
    # only a worker of this run: a pid in the folder may be anyone's (a program wrote it, or
    # the pid was reused); the launcher's pid is a worker's variable, or the launcher's own
    agent = os.environ.get(AGENT_PID_VAR, "")
    agent_pid = int(agent) if agent.isdigit() else os.getpid()
    asked = {}
    for rank, info in (rundir.read_rank_infos(run_dir) if infos is None else infos).items():
        if rank in skip or info.host != host or sig is None or not _answers(info.pid, sig) \
                or not rundir.started_by(info.pid, agent_pid):
            continue
        path = rundir.stack_path(run_dir, rank)
        size = path.stat().st_size if path.exists() else 0
        try:
            os.kill(info.pid, sig)
        except OSError:  # gone already
            continue
        asked[rank] = (info, path, size)
    return asked


def _answers(pid: int, sig: int) -> bool:
    """Whether ``pid`` catches or ignores ``sig`` (``/proc/PID/status``): a process whose program
    reset it to the default action would be killed by the request. True where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            masks = {k: v.strip() for k, _, v in (line.partition(":") for line in fh)}
    except OSError:
        return True
    bit = 1 << (sig - 1)
    try:
        return any(int(masks[name], 16) & bit for name in ("SigCgt", "SigIgn"))
    except (KeyError, ValueError):
        return True


def _read_dumps(asked: _Asked) -> dict[int, str]:
    deadline = time.monotonic() + _DUMP_WAIT_S
    texts: dict[int, str] = {}
    while asked.keys() - texts.keys() and time.monotonic() < deadline:
        time.sleep(0.05)
        for rank, (_, path, size) in asked.items():
            if rank not in texts and path.exists() and path.stat().st_size > size:
                time.sleep(0.05)  # let the handler finish writing
                with open(path, encoding="utf-8", errors="replace") as fh:
                    fh.seek(size)
                    texts[rank] = fh.read(READ_LIMIT)   # a stack dump: kilobytes
    return texts


def stacks_of(run_dir: str, skip: set[int],
              infos: dict[int, rundir.RankInfo] | None = None) -> dict[int, str]:
    """Ask every worker of this host not in ``skip`` (of ``infos``, else of the run folder) for
    its stacks; rank -> the dump's text (a rank that gave none within a few seconds is absent)."""
    return _read_dumps(_request_stacks(run_dir, skip, infos))


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def diagnose(exc: BaseException, *, run_dir: str, rank: int, world_size: int, attempt: int,
             own_stack: IO[str] | None, waited_s: float | None) -> rundir.ErrorRecord:
    """In the rank whose collective timed out: dump every local rank's stack and say which
    ranks did not reach the collective."""
    if own_stack is not None:  # this rank's own view: where it waited, and every thread
        try:
            own_stack.write("".join(traceback.format_exception(exc)) + "\n")
            own_stack.flush()
            faulthandler.dump_traceback(file=own_stack, all_threads=True)
        except (OSError, ValueError):
            pass
    asked = _request_stacks(run_dir, {rank})
    dumps = _read_dumps(asked)
    where_wait = _innermost(exc.__traceback__, waiting=True)
    where_user = _innermost(exc.__traceback__, waiting=False)
    op = where_wait.func if where_wait is not None else "a collective"
    match = _MS_RE.search(str(exc))
    seconds = int(match[1]) / 1000 if match else waited_s
    at = f" at {where_user.short()}" if where_user is not None else ""
    return _verdict(waiter=rank, waited=f"waited in {op}{at}", seconds=seconds, asked=asked,
                    dumps=dumps, world_size=world_size, run_dir=run_dir, attempt=attempt,
                    where=where_user.short() if where_user else "")


# What a worker that died of a collective timeout (NCCL's watchdog aborts the process, so the
# worker entry never sees an exception) leaves at the end of its stderr.
_DIED_OF_TIMEOUT = ("Timed out waiting", "collective operation timeout", "Watchdog caught")


def died_of_timeout(stderr_tail: tuple[str, ...] | list[str]) -> bool:
    """True when a dead worker's last stderr lines report a collective timeout."""
    return any(marker in line for line in stderr_tail for marker in _DIED_OF_TIMEOUT)


def diagnose_dead(rank: int, *, run_dir: str, world_size: int, attempt: int,
                  dead: set[int]) -> rundir.ErrorRecord:
    """In the launcher, for a rank that died of a collective timeout without a word of its
    own (an abort): ask the surviving local ranks for their stacks before they are stopped."""
    asked = _request_stacks(run_dir, dead)
    dumps = _read_dumps(asked)
    return _verdict(waiter=rank, waited="timed out waiting in a collective and aborted",
                    seconds=None, asked=asked, dumps=dumps, world_size=world_size,
                    run_dir=run_dir, attempt=attempt, where="", absent_ok=dead)


def _verdict(*, waiter: int, waited: str, seconds: float | None, asked: _Asked,
             dumps: dict[int, str], world_size: int, run_dir: str, attempt: int, where: str,
             absent_ok: set[int] | None = None) -> rundir.ErrorRecord:
    """The record: ranks whose main thread is outside torch did not arrive."""
    after = f" within {seconds:g} s" if seconds else ""
    absent: list[int] = []
    notes: list[str] = []
    for peer, (info, _, _) in sorted(asked.items()):
        frame = main_thread_frame(dumps.get(peer, ""), info.thread)
        if frame is None:
            absent.append(peer)
            notes.append(f"rank {peer} (host {info.host}) gave no stack")
        elif not frame.waiting:
            absent.append(peer)
            notes.append(f"rank {peer} (host {info.host}) is at {frame.short()}")
    local = set(asked) | {waiter} | (absent_ok or set())
    elsewhere = [r for r in range(world_size) if r not in local]
    stacks = str(Path(run_dir) / rundir.STACKS)
    if absent:
        missing = absent
        message = (f"{_ranks(absent)} did not reach the collective{after}: "
                   f"{'; '.join(notes)}; rank {waiter} {waited}")
    elif elsewhere:
        missing = elsewhere
        message = (f"a rank on another node did not reach the collective{after} "
                   f"(every rank of host {socket.gethostname()} waits in one; the others are "
                   f"{_ranks(elsewhere)}); rank {waiter} {waited}")
    else:
        missing = []
        message = (f"every rank waited in a collective{after}: they called different "
                   f"collectives, or in a different order; rank {waiter} {waited}")
    hint = (f"every rank's Python stack is in {stacks}; if that rank was busy on purpose (a long "
            "save or evaluation), raise the limit: scaletrain run --timeout SECONDS or "
            "scaletrain.init(step_timeout_s=...)")
    return rundir.ErrorRecord(rank=waiter, kind="timeout", type="CollectiveTimeoutError",
                              message=message, hint=hint, exit_code=1, where=where,
                              attempt=attempt, missing=missing)
