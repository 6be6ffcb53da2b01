"""A run whose training finished always ends (issue 39): workers stuck in their teardown are
named with their stacks, stopped, and the launch exits with the training's result.

torch's gloo teardown can deadlock after the last step (``destroy_process_group``, or the
interpreter's exit freeing a DDP model whose process group joins its threads); the agent
then waits for ever and nothing is printed. The watch here runs in the launcher beside the
agent, on the worker's own reports in the run folder:

- a worker is *done* once its program returned (``finished/``, the worker entry), or it
  called ``destroy_process_group()`` on the default group (the group records,
  :mod:`scaletrain.launch.inproc.group_record`), or it is gone;
- once every worker of this node is done and some still live past :func:`teardown_wait`
  seconds, each survivor whose main thread used no CPU meanwhile (a deadlock waits; a slow
  exit on a loaded machine works) is asked for its stack
  (:mod:`scaletrain.launch.inproc.hang`); one whose main thread is inside torch, or runs no
  Python at all (the interpreter's own teardown), is stuck: its stack stays in the run folder, one line names it and where it
  waits, and it is killed. A survivor in code of its own (an evaluation after
  ``destroy_process_group``, an upload at exit) is left alone and asked again later.

The launcher then reports the training's result (0), not the agent's view of the ranks it
stopped.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import TextIO

from scaletrain.contract.environ import TEARDOWN_WAIT_VAR
from scaletrain.launch import rundir
from scaletrain.launch.frames import short_path
from scaletrain.launch.inproc import hang
from scaletrain.launch.inproc.group_record import read_records

# Seconds a finished run's workers may take to exit. A healthy gloo/NCCL teardown takes well
# under one; the margin is for a loaded machine and for a program's own exit handlers.
TEARDOWN_WAIT_S = 30.0
_POLL_S = 0.5


def teardown_wait(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds finished workers may take to exit (``SCALETRAIN_TEARDOWN_TIMEOUT``, else 30)."""
    try:
        value = float(environ.get(TEARDOWN_WAIT_VAR, ""))
    except ValueError:
        return TEARDOWN_WAIT_S
    return value if 0 < value < float("inf") else TEARDOWN_WAIT_S


def _stat(pid: int) -> list[str]:
    """The fields of ``pid``'s main thread's /proc stat after its name (state first)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rpartition(")")[2].split()
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie the agent has not reaped yet has ended)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def _cpu_ticks(pid: int) -> int:
    """CPU time ``pid``'s main thread has used (user + system, in clock ticks)."""
    fields = _stat(pid)
    return int(fields[11]) + int(fields[12]) if len(fields) > 12 else 0


class TeardownWatch:
    """Watches one node's workers (global ``ranks``) for a teardown that does not end."""

    def __init__(self, run_dir: str, records: str, ranks: Collection[int], wait_s: float,
                 out: TextIO | None = None) -> None:
        self.run_dir, self.records, self.ranks, self.wait_s = run_dir, records, set(ranks), wait_s
        self.out = out
        self.stopped: dict[int, str] = {}   # rank -> where it was stuck
        self._since: float | None = None
        self._ticks: dict[int, int] = {}    # rank -> its main thread's CPU time when the clock began

    def poll(self, now: float) -> None:
        """One look: start the clock when every worker is done, act when it has run out."""
        infos = {r: i for r, i in rundir.read_rank_infos(self.run_dir).items() if r in self.ranks}
        if set(infos) != self.ranks:
            return  # not every worker has started (or this is another node's folder)
        finished = rundir.read_finished(self.run_dir)
        torn = read_records(self.records).torn_down
        alive = {r: info for r, info in infos.items() if _alive(info.pid)}
        done = all(r in finished or info.pid in torn or r not in alive
                   for r, info in infos.items())
        if not done or not alive:
            self._since = None
            return
        if self._since is None:
            self._since = now
            self._ticks = {r: _cpu_ticks(info.pid) for r, info in alive.items()}
        if now - self._since < self.wait_s:
            return
        # a main thread that used CPU meanwhile is slow, not stuck (a loaded machine's exit
        # collects garbage for seconds); a deadlock waits without using any
        waiting = {r: info for r, info in alive.items()
                   if _cpu_ticks(info.pid) <= self._ticks.get(r, 0) + 1}
        self._since, self._ticks = now, {r: _cpu_ticks(i.pid) for r, i in alive.items()}
        if not waiting:
            return  # asked again one wait later
        others = set(rundir.read_rank_infos(self.run_dir)) - set(waiting)  # other nodes' too
        dumps = hang.stacks_of(self.run_dir, skip=others)
        for rank, info in sorted(waiting.items()):
            frame = hang.main_thread_frame(dumps.get(rank, ""), info.thread)
            if frame is not None and not frame.waiting:
                continue  # the program's own code: not a teardown
            where = frame.short() if frame is not None else "the interpreter's exit (no Python frame)"
            self._stop(rank, info, where)

    def _stop(self, rank: int, info: rundir.RankInfo, where: str) -> None:
        try:
            rundir.write_finished(self.run_dir, rank)  # its training completed: no restart
        except OSError:
            pass
        try:
            os.kill(info.pid, signal.SIGKILL)  # stuck in C: only SIGKILL ends it
        except OSError:
            return  # it ended by itself meanwhile
        self.stopped[rank] = where
        stacks = short_path(str(rundir.stack_path(self.run_dir, rank)))  # as the user's shell names it
        print(f"scaletrain: rank {rank} (pid {info.pid}) finished training but was still "
              f"tearing down after {self.wait_s:g} s, at {where}; stopped it (its stack: "
              f"{stacks})", file=self.out or sys.stderr, flush=True)

    def ended_training(self) -> bool:
        """Whether this watch stopped a rank: it acts only once every worker of the node had
        finished training, so the agent's report of that rank (and of the others it then
        stopped) is not the training's result."""
        return bool(self.stopped)


@contextmanager
def watching_teardown(run_dir: str, records: str, ranks: Collection[int],
                      wait_s: float) -> Iterator[TeardownWatch]:
    """Within the block, a thread polls a :class:`TeardownWatch` every half second."""
    watch = TeardownWatch(run_dir, records, ranks, wait_s)
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
