"""Whether a worker still works: the CPU time its threads, and the processes it started, use.

A deadlock waits without using any CPU: a non-daemon thread asleep, a lock taken twice, gloo's
teardown waiting on a peer that is gone. An upload, a flush or a child process that compresses
a file each use some. :mod:`scaletrain.launch.teardown` tells the two apart by two samples of
the kernel's counters (``/proc/PID/task/TID/stat`` for each thread, ``/proc/PID/stat`` for each
descendant process), some seconds apart. Not Linux: nothing is found, and nothing is said to
work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from scaletrain.launch.reaper import descendants

# A clock tick is 10 ms where CLK_TCK is 100 (every Linux we know); the sampled window is
# seconds long, so more than one tick means the thread ran, not that the kernel rounded
_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
WORK_TICKS = 2

Who = tuple[str, int]   # ("thread", TID), ("process", PID) or ("reaped", PID)


def _ticks(path: str, *, reaped: bool = False) -> int | None:
    """utime + stime from a /proc stat file (with cutime + cstime: the reaped children's
    time, when ``reaped``); None when it is gone."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return None
    try:
        own = int(fields[11]) + int(fields[12])
        return own + (int(fields[13]) + int(fields[14]) if reaped else 0)
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class CpuTicks:
    """The CPU counters of one process and its descendants at one moment."""

    threads: dict[int, int] = field(default_factory=dict)    # TID -> its ticks
    children: dict[int, int] = field(default_factory=dict)   # descendant PID -> its ticks
    reaped: int = 0                                          # the children it reaped


def sample(pid: int) -> CpuTicks:
    """The counters of ``pid``'s threads and of every process below it."""
    threads: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    for tid in tids:
        ticks = _ticks(f"/proc/{pid}/task/{tid}/stat") if tid.isdigit() else None
        if ticks is not None:
            threads[int(tid)] = ticks
    total = _ticks(f"/proc/{pid}/stat", reaped=True)
    own = _ticks(f"/proc/{pid}/stat")
    reaped = total - own if total is not None and own is not None else 0
    children = {}
    for kid in descendants(pid):
        ticks = _ticks(f"/proc/{kid}/stat", reaped=True)
        if ticks is not None:
            children[kid] = ticks
    return CpuTicks(threads=threads, children=children, reaped=reaped)


def used(before: CpuTicks, after: CpuTicks, *, skip: frozenset[int] = frozenset()) -> dict[Who, int]:
    """Who used CPU between the two samples (ticks, only those above 0); threads in ``skip``
    (daemon threads: the exit does not wait for them) are left out. A thread or process born
    meanwhile counts with all it used."""
    out: dict[Who, int] = {}
    for tid, ticks in after.threads.items():
        if tid not in skip and ticks - before.threads.get(tid, 0) > 0:
            out[("thread", tid)] = ticks - before.threads.get(tid, 0)
    for pid, ticks in after.children.items():
        if ticks - before.children.get(pid, 0) > 0:
            out[("process", pid)] = ticks - before.children.get(pid, 0)
    if after.reaped > before.reaped:   # a child that worked and ended meanwhile
        out[("reaped", 0)] = after.reaped - before.reaped
    return out


def works(usage: dict[Who, int]) -> bool:
    """Whether ``usage`` (from :func:`used`) is work rather than a wait's rounding."""
    return sum(usage.values()) >= WORK_TICKS


def seconds(ticks: int) -> float:
    """CPU seconds of ``ticks`` clock ticks."""
    return ticks * _TICK_S


def comm(pid: int, tid: int | None = None) -> str:
    """The kernel's name of process ``pid`` (or of its thread ``tid``), "" when gone."""
    path = f"/proc/{pid}/task/{tid}/comm" if tid is not None else f"/proc/{pid}/comm"
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(64).strip()
    except OSError:
        return ""
