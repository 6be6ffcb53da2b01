"""A run whose training finished always ends, and nothing a program still does is lost.

After the last step a worker may not exit: torch's gloo teardown can deadlock (in
``destroy_process_group``, or while the interpreter's exit frees a DDP model), a non-daemon
thread the program started may sleep for ever, and the interpreter's exit waits for every
non-daemon thread. The agent would then wait for ever, printing nothing. The watch here runs in
the launcher beside the agent, on the worker's own reports in the run folder:

- a worker is *done* once its program returned (``finished/``, the worker entry, which lists
  its threads then), or it called ``destroy_process_group()`` on the default group (the group
  records, :mod:`scaletrain.launch.inproc.group_record`), or it is gone;
- once every worker of this node is done and some still live :attr:`Bounds.wait_s` later
  (``SCALETRAIN_TEARDOWN_TIMEOUT``), each survivor is named in one line: its rank, its pid,
  the threads its exit waits on (the non-daemon threads alive when its program returned, else
  its main thread) and where each one is (its stack, :mod:`scaletrain.launch.inproc.hang`);
- a survivor none of whose threads (daemon threads aside: the exit never waits for them) nor
  child processes used CPU meanwhile (:mod:`scaletrain.launch.busy`) is stuck, whatever code
  it waits in - a thread asleep, a lock taken twice in the program's own frames, torch's
  teardown, or no Python frame at all: its stack stays in the run folder and it is killed;
- a survivor that works (an upload, a flush, a child process) is left to finish, and said so
  once; one still alive :attr:`Bounds.work_s` after training (``SCALETRAIN_TEARDOWN_WORK_TIMEOUT``)
  is killed too.

The launcher then reports the training's result (0), not the agent's view of the ranks it
stopped.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from scaletrain import settings
from scaletrain.contract.environ import TEARDOWN_WAIT_VAR, TEARDOWN_WORK_VAR
from scaletrain.launch import busy, rundir
from scaletrain.launch.frames import short_path
from scaletrain.launch.inproc import hang
from scaletrain.launch.inproc.group_record import read_records
from scaletrain.launch.reaper import children

# Seconds a finished run's workers may take to exit. A healthy gloo/NCCL teardown takes well
# under one; the margin is for a loaded machine and for a program's own exit handlers.
TEARDOWN_WAIT_S = 30.0
# Seconds after training a worker still working at its exit (an upload of the last checkpoint)
# is left to finish: an outer bound, so that a thread looping for ever cannot hold the run.
TEARDOWN_WORK_S = 3600.0
_MOST_S = 7 * 24 * 3600.0   # a week: longer than any batch job may run
_POLL_S = 0.5
_NAMED = 4                  # threads named in a line, the rest counted
LIBRARY_WORK = 0.1          # the share of a CPU a library's own thread must use to be working

WAIT = settings.Spec(doc="seconds the workers of a run whose training finished may take to exit "
                         "before the launcher ends those that wait without using CPU",
                     check=settings.number(above=0, high=_MOST_S), unit="s")
WORK = settings.Spec(doc="seconds after training a worker still working at its exit (an upload, "
                         "a flush) is left to finish before the launcher ends it",
                     check=settings.number(above=0, high=_MOST_S), unit="s")


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """How long finished workers may take to exit, and to work at their exit."""

    wait_s: float = TEARDOWN_WAIT_S
    work_s: float = TEARDOWN_WORK_S


def bounds(environ: Mapping[str, str] = os.environ) -> Bounds:
    """The bounds ``environ`` sets; SettingError (one line naming the variable) for garbage."""
    wait = settings.from_environ(WAIT, environ, TEARDOWN_WAIT_VAR, float)
    work = settings.from_environ(WORK, environ, TEARDOWN_WORK_VAR, float)
    return Bounds(wait_s=TEARDOWN_WAIT_S if wait is None else wait,
                  work_s=TEARDOWN_WORK_S if work is None else work)


def _rank_of(pid: int) -> int | None:
    """The global rank torch's agent started child ``pid`` as (its ``RANK``), or None."""
    environ = rundir.environ_of(pid)
    if not any(item.startswith(b"TORCHELASTIC_RUN_ID=") for item in environ):
        return None
    value = next((item[5:] for item in environ if item.startswith(b"RANK=")), b"")
    return int(value) if value.isdigit() else None


@dataclass(frozen=True, kw_only=True)
class _Look:
    """What one survivor did over the last wait."""

    info: rundir.RankInfo
    threads: list[rundir.ThreadInfo] | None   # its threads when its program returned
    usage: dict[busy.Who, int]                # the CPU it used meanwhile, daemon threads aside
    live: frozenset[int]                      # its threads (TIDs) at the end of the wait
    own: frozenset[int]                       # those that may run the program's code
    window_s: float                           # the wait the usage covers

    def holders(self) -> list[rundir.ThreadInfo]:
        """The non-daemon threads alive when its program returned, and alive still."""
        return [t for t in self.threads or () if not t.daemon and t.native_id in self.live]

    def own_work(self) -> bool:
        """Whether the program's own code works: its main thread, a thread its exit may wait
        on, a child process."""
        return busy.works({who: ticks for who, ticks in self.usage.items()
                           if who[0] != "thread" or who[1] in self.own})

    def works(self) -> bool:
        """The program's own work, or a library's thread (gloo's loop, a pool of torch's) that
        is busy: such a thread ticks now and then while its process waits (gloo's loop after
        its peer left, 1% of a CPU), so only a tenth of the wait counts as work."""
        floor = LIBRARY_WORK * self.window_s
        return self.own_work() or any(kind == "thread" and tid not in self.own
                                      and busy.seconds(ticks) >= floor
                                      for (kind, tid), ticks in self.usage.items())


class TeardownWatch:
    """Watches one node's workers (global ``ranks``) for an exit that does not end."""

    def __init__(self, run_dir: str, records: str, ranks: Collection[int], limits: Bounds,
                 out: TextIO | None = None) -> None:
        self.run_dir, self.records, self.ranks, self.limits = run_dir, records, set(ranks), limits
        self.out = out
        self.stopped: dict[int, str] = {}      # rank -> where it was, when it was ended
        self._since: float | None = None       # when every worker was done
        self._looked = 0.0                     # when the CPU counters were last sampled
        self._samples: dict[int, busy.CpuTicks] = {}
        self._busy: dict[int, int] = {}        # rank -> waits in a row in which it worked
        self._told: set[int] = set()           # ranks said to be still working
        self._seen: dict[int, rundir.RankInfo] = {}

    def poll(self, now: float) -> None:
        """One look: start the clock when every worker is done, act when a wait has passed."""
        infos = self._workers()
        if set(infos) != self.ranks:
            return  # not every worker has started (or this is another node's folder)
        finished = rundir.read_finished(self.run_dir)
        torn = read_records(self.records).torn_down
        alive = {r: info for r, info in infos.items() if rundir.running(info.pid)}
        done = all(r in finished or info.pid in torn or r not in alive
                   for r, info in infos.items())
        if not done or not alive:
            self._since = None
            return
        if self._since is None:
            self._since = self._looked = now
            self._samples = {r: busy.sample(i.pid) for r, i in alive.items()}
            return
        if now - self._looked < self.limits.wait_s:
            return
        looks = {r: self._look(r, info, now - self._looked) for r, info in alive.items()}
        over = now - self._since >= self.limits.work_s
        act = {r for r, look in looks.items()
               if not look.works() or over or r not in self._told}
        if act:
            dumps = hang.stacks_of(self.run_dir, skip=set(infos) - act, infos=infos)
            for rank in sorted(act):
                if rank in dumps or rundir.running(alive[rank].pid):  # else it ended meanwhile
                    self._act(rank, looks[rank], dumps.get(rank, ""), after=now - self._since,
                              over=over)
        # sampled after the stacks were written: a dump's own CPU is not the program's work
        self._looked = now
        self._samples = {r: busy.sample(i.pid) for r, i in alive.items() if r not in self.stopped}

    def _workers(self) -> dict[int, rundir.RankInfo]:
        """This node's workers: as each published itself in the run folder where that pid is a
        child of this launcher (a program may write over its file, or remove the folder), else
        the child whose environment names that rank, else as last seen (it ended since)."""
        kids = children(os.getpid())
        found = {r: i for r, i in rundir.read_rank_infos(self.run_dir).items()
                 if r in self.ranks and i.pid in kids}
        for pid in kids - {i.pid for i in found.values()}:
            rank = _rank_of(pid)
            if rank in self.ranks and rank not in found:
                found[rank] = rundir.RankInfo(rank=rank, host=socket.gethostname(), pid=pid,
                                              thread=0)
        self._seen.update(found)
        return dict(self._seen)

    def _look(self, rank: int, info: rundir.RankInfo, window_s: float) -> _Look:
        threads = rundir.read_exit_threads(self.run_dir, rank)
        after = busy.sample(info.pid)
        usage = busy.used(self._samples.get(rank, busy.CpuTicks()), after,
                          skip=frozenset(t.native_id for t in threads or () if t.daemon))
        if threads is not None:   # the program returned, listing its threads
            own = {t.native_id for t in threads if not t.daemon}
        else:   # a thread the program started has its main thread's name; a library's, its own
            main = busy.comm(info.pid, info.pid)
            own = {tid for tid in after.threads if busy.comm(info.pid, tid) == main}
        look = _Look(info=info, threads=threads, usage=usage, live=frozenset(after.threads),
                     own=frozenset(own | {info.pid}), window_s=window_s)
        self._busy[rank] = self._busy.get(rank, 0) + 1 if look.works() else 0
        return look

    def _act(self, rank: int, look: _Look, dump: str, *, after: float, over: bool) -> None:
        info = look.info
        head = (f"scaletrain: rank {rank} (pid {info.pid}) finished training but had not exited "
                f"{_secs(after)} s later; its exit waits on {_holders(look, dump)}")
        # the stack file's path as the user's shell names it (relative below the current folder)
        stacks = f" (its stack: {short_path(str(rundir.stack_path(self.run_dir, rank)))})" if dump else ""
        if not look.works():
            if self._stop(rank, info, dump):
                self._say(f"{head}; none of its threads used CPU in the last "
                          f"{self.limits.wait_s:g} s: ended it{stacks}")
            return
        working = _working(look)
        if over:
            if self._stop(rank, info, dump):
                self._say(f"{head}; {working} still worked {_secs(after)} s after training: "
                          f"ended it ({TEARDOWN_WORK_VAR}={self.limits.work_s:g}){stacks}")
            return
        # the program's own work is told at once, a library thread's once it lasts a second
        # wait; the interpreter's own exit (its program returned, no thread holds it, no Python
        # frame: slow on a loaded machine) is not, and is ended at the bound like any other
        in_exit = (look.threads is not None and not look.holders()
                   and hang.thread_frames(dump).get(info.thread) is None)
        if in_exit or (self._busy.get(rank, 0) < 2 and not look.own_work()):
            return
        self._told.add(rank)
        self._say(f"{head}; {working} still works: left to finish, and ended if it has not "
                  f"exited {self.limits.work_s:g} s after training ({TEARDOWN_WORK_VAR})")

    def _stop(self, rank: int, info: rundir.RankInfo, dump: str) -> bool:
        """SIGKILL the worker (stuck in C, only SIGKILL ends it); False if it ended by itself."""
        if info.pid not in children(os.getpid()):
            return False   # ended and reaped meanwhile: its pid is no longer a worker's
        try:
            if rank not in rundir.read_finished(self.run_dir):
                rundir.write_finished(self.run_dir, rank)  # its training completed: no restart
        except OSError:
            pass
        try:
            os.kill(info.pid, signal.SIGKILL)
        except OSError:
            return False
        self.stopped[rank] = hang.thread_places(dump).get(info.thread) or "no Python frame"
        return True

    def _say(self, line: str) -> None:
        print(line, file=self.out or sys.stderr, flush=True)

    def ended_training(self) -> bool:
        """Whether this watch stopped a rank: it acts only once every worker of the node had
        finished training, so the agent's report of that rank (and of the others it then
        stopped) is not the training's result."""
        return bool(self.stopped)


def _quoted(name: str) -> str:
    return f" {name!r}" if name else ""


def _secs(seconds: float) -> str:
    return f"{round(seconds, 1):g}"


def _where(places: dict[int, str | None], ident: int, dumped: bool,
           none: str = "in no Python frame") -> str:
    if not dumped:
        return "(it gave no stack)"
    if ident not in places:
        return "(not in its stack)"
    place = places[ident]
    return f"at {place}" if place is not None else none


def _holders(look: _Look, dump: str) -> str:
    """The threads the worker's exit waits on, and where each is: the non-daemon threads alive
    when its program returned, else its main thread (and, when the program has not returned,
    every other thread of its stack: which of them are daemons is not known)."""
    info, frames = look.info, hang.thread_places(dump)
    named = [f"thread {t.name!r} {_where(frames, t.ident, bool(dump))}" for t in look.holders()]
    if not named:
        named = ["its main thread " + _where(frames, info.thread, bool(dump),
                                             none="in the interpreter's exit (no Python frame)")]
        if look.threads is None:
            named += [f"thread 0x{ident:x} {_where(frames, ident, True)}"
                      for ident in frames if ident != info.thread]
    more = f" and {len(named) - _NAMED} more" if len(named) > _NAMED else ""
    return ", ".join(named[:_NAMED]) + more


def _working(look: _Look) -> str:
    """Who used the CPU, most first: "thread 'upload' (0.84 s of CPU)"."""
    names = {t.native_id: f"thread {t.name!r}" for t in look.threads or ()}
    ranked = sorted(look.usage.items(), key=lambda item: -item[1])
    parts = []
    shown = [ranked[0], *(r for r in ranked[1:_NAMED] if r[1] >= busy.WORK_TICKS)]
    for (kind, ident), ticks in shown:
        if kind == "thread":
            native = f"its thread {ident}{_quoted(busy.comm(look.info.pid, ident))}"
            who = "its main thread" if ident == look.info.pid else names.get(ident, native)
        elif kind == "process":
            who = f"its child process {ident}{_quoted(busy.comm(ident))}"
        else:
            who = "child processes that ended"
        parts.append(f"{who} ({busy.seconds(ticks):.2f} s of CPU)")
    return ", ".join(parts)


@contextmanager
def watching_teardown(run_dir: str, records: str, ranks: Collection[int],
                      limits: Bounds) -> Iterator[TeardownWatch]:
    """Within the block, a thread polls a :class:`TeardownWatch` every half second."""
    watch = TeardownWatch(run_dir, records, ranks, limits)
    done = threading.Event()

    def run() -> None:
        while not done.wait(_POLL_S):
            try:
                watch.poll(time.monotonic())
            except Exception as exc:  # noqa: BLE001 - the watch must never stop the launch
                print(f"scaletrain: the teardown watch stopped: {exc}", file=sys.stderr)
                return

    thread = threading.Thread(target=run, name="scaletrain-teardown-watch", daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        done.set()
        thread.join()
