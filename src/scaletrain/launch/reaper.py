"""Every process a worker starts ends with the run.

torch's agent gives each worker a session of its own and, when it stops them, signals that
group; it never looks further. A worker's own children outlive it: ``mp.spawn`` workers, a
child that ignores SIGTERM, a daemon that double-forks and calls ``setsid`` (a new session,
outside every group we know), or anything left when the worker simply exits 0. Orphans
reparent to init and train on, holding GPUs and ports.

So the launcher becomes a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): an
orphan among its descendants is reparented to it instead of init, so the process tree below
it stays complete. When the run ends (success, failure, a signal) :func:`ending_with_run`
finds every descendant started by this run's workers - they carry the launcher's PID in
``SCALETRAIN_AGENT_PID``, inherited through fork and exec - sends SIGTERM, waits up to the
shutdown grace period, sends SIGKILL to what is left, and reaps them. Python's multiprocessing
helpers (the resource tracker ``mp.spawn`` starts) end by themselves once their parent has:
they are given the grace period to, and named only if they outlive it. Not Linux: nothing
is found and nothing is done. A ``kill -9`` of the launcher itself cannot be handled here
(workers die with it through ``PR_SET_PDEATHSIG``; their children are not reached).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from scaletrain.contract.environ import AGENT_PID_VAR
from scaletrain.launch.rundir import environ_of, running

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_POLL_S = 0.05


def _prctl(option: int, value: object) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def is_subreaper() -> bool:
    """True when this process already collects its descendants' orphans."""
    flag = ctypes.c_int(0)
    return _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.pointer(flag)) and flag.value != 0


def set_subreaper(on: bool) -> bool:
    """Make this process (not) the reaper of its descendants' orphans; False if not possible."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def children(pid: int) -> set[int]:
    """Direct children of ``pid`` (every thread's), from /proc; empty where there is no /proc."""
    kids: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                kids.update(int(p) for p in fh.read().split())
        except OSError:
            continue
    return kids


def descendants(pid: int, *, skip: Iterable[int] = ()) -> set[int]:
    """Every process below ``pid``, not entering the subtrees rooted at ``skip``."""
    skipped = set(skip)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for kid in children(todo.pop()):
            if kid not in found and kid not in skipped:
                found.add(kid)
                todo.append(kid)
    return found


def _marked(pid: int, marker: bytes) -> bool:
    return marker in environ_of(pid)


def run_processes(before: set[int], agent_pid: int | None = None) -> set[int]:
    """This run's processes below us: those carrying our PID in ``SCALETRAIN_AGENT_PID``, and
    their whole subtrees (a program may exec a child with an environment of its own)."""
    me = os.getpid()
    marker = f"{AGENT_PID_VAR}={agent_pid if agent_pid is not None else me}".encode()
    found: set[int] = set()
    todo = [(kid, False) for kid in children(me) if kid not in before]
    while todo:
        pid, inside = todo.pop()
        inside = inside or _marked(pid, marker)
        if inside:
            found.add(pid)
        todo.extend((kid, inside) for kid in children(pid))
    return found


def send(pids: Iterable[int], signum: int) -> None:
    """Send ``signum`` to each of ``pids``, skipping those already gone."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:  # already gone
            pass


def _reap(pids: Iterable[int]) -> None:
    """Collect the exit status of those of ``pids`` that are our children (orphans we adopted)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass


def stop_processes(pids: set[int], grace_s: float) -> set[int]:
    """SIGTERM ``pids``, wait up to ``grace_s``, SIGKILL the rest; returns those killed."""
    send(pids, signal.SIGTERM)
    left = _outlived(pids, grace_s)
    send(left, signal.SIGKILL)
    _outlived(left, 5.0)
    _reap(pids)
    return left


# Python's own multiprocessing helpers: each ends by itself once the process that started it
# has (its pipe closes), after cleaning up what that process left (semaphores, shared memory).
# mp.spawn and a DataLoader's workers start the resource tracker; a clean run is not a leak.
_SELF_ENDING = (b"multiprocessing.resource_tracker", b"multiprocessing.semaphore_tracker",
                b"multiprocessing.forkserver")


def _ends_by_itself(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            command = fh.read(4096)
    except OSError:
        return False
    return any(name in command for name in _SELF_ENDING)


def _outlived(pids: set[int], grace_s: float) -> set[int]:
    """Those of ``pids`` still running after up to ``grace_s`` (reaped as they end)."""
    deadline = time.monotonic() + grace_s
    left = {p for p in pids if running(p)}
    while left and time.monotonic() < deadline:
        _reap(left)
        time.sleep(_POLL_S)
        left = {p for p in left if running(p)}
    _reap(pids)
    return left


@contextmanager
def ending_with_run(grace_s: float) -> Iterator[None]:
    """Adopt the orphans of this run's workers while it lasts, and stop them all when it ends."""
    before = children(os.getpid())  # whatever the caller had running is not ours to stop
    was = is_subreaper()
    became = was or set_subreaper(True)
    try:
        yield
    finally:
        try:
            found = run_processes(before)
            helpers = {pid for pid in found if _ends_by_itself(pid)}
            left = found - helpers
            killed = stop_processes(left, grace_s) if left else set()
            # a helper still there once the rest are gone (up to the grace period) was stuck
            stuck = _outlived(helpers, grace_s)
            if stuck:
                killed |= stop_processes(stuck, 0.0)
                left |= stuck
            if left:
                how = f", {len(killed)} of them with SIGKILL after {grace_s:g} s" if killed else ""
                print(f"scaletrain: stopped {len(left)} process(es) the workers had started and "
                      f"left running (PIDs {', '.join(map(str, sorted(left)))}){how}",
                      file=sys.stderr, flush=True)
        finally:
            if became and not was:
                set_subreaper(False)
