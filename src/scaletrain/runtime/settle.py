"""Let torch's threads let go of Python objects before a group is destroyed or the interpreter
exits: a deadlock in ``destroy_process_group()``, or a SIGABRT at exit, otherwise.

A gloo worker thread marks a collective complete *before* it drops the work, and that drop
frees the work's tensors; a tensor whose Python object the program has already dropped then
takes the GIL to free it. ``destroy_process_group()`` joins those threads (in ~ProcessGroupGloo)
while holding the GIL: a deadlock when a drop is still to come. At exit, Py_FinalizeEx ends a
thread that asks for the GIL with pthread_exit inside a noexcept destructor: SIGABRT.

- :func:`let_go`: after a collective, wait until torch's threads hold none of its tensors
  (every collective scaletrain issues, :mod:`scaletrain.runtime.collectives`);
- :func:`destroy_group`: ``destroy_process_group()`` between two waits for gloo's threads - the
  one way scaletrain and its tests destroy a group (``scaletrain.shutdown()`` too);
- :func:`settle_gloo_workers`: the wait itself, also at the end of a worker of ``scaletrain
  run``, once the user's program has returned.

Linux /proc for the thread states; elsewhere there is nothing to read and nothing waits.
Nothing here imports torch.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from scaletrain import module_state

SETTLE_TIMEOUT_S = 5.0
GLOO_WORKER = "pt_gloo_runloop"  # the name c10d gives ProcessGroupGloo's worker threads (2.11+)
_POLL_S = 0.0005  # between two looks at a tensor's holders (the GIL released meanwhile)
T = TypeVar("T")


def thread_activity(tid: str) -> tuple[str, str] | None:
    """(state letter, context-switch counters) of one thread of this process, None if gone."""
    try:
        with open(f"/proc/self/task/{tid}/status", encoding="ascii") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
    except OSError:
        return None
    return (fields.get("State", "?").strip()[:1],
            fields.get("voluntary_ctxt_switches", "").strip() + "/"
            + fields.get("nonvoluntary_ctxt_switches", "").strip())


def gloo_worker_tids() -> list[str]:
    """The thread ids of every ProcessGroupGloo worker thread alive in this process."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:  # not Linux: nothing to inspect
        return []
    found = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="ascii") as fh:
                if fh.read().strip() == GLOO_WORKER:
                    found.append(tid)
        except OSError:
            continue
    return found


def waiting_for_the_gil() -> int:
    """How many threads of this interpreter other than this one ask for the GIL from C/C++.

    A C++ thread that frees a Python object (a gloo worker dropping a work) makes itself a
    thread state and waits in it for the GIL; that state has no Python frame. A Python thread
    has one (also while it waits in C), except for an instant as it starts or ends. Read through
    CPython's public C API under the GIL; 0 where that API cannot be reached.
    """
    api = _c_api()
    if api is None:
        return 0
    me, count = api.PyThreadState_Get(), 0
    state = api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while state:
        if state != me:
            frame = api.PyThreadState_GetFrame(state)  # a new reference, or NULL
            if frame:
                api.Py_DecRef(frame)
            else:
                count += 1
        state = api.PyThreadState_Next(state)
    return count


_C_NAMES = ("PyInterpreterState_Get", "PyInterpreterState_ThreadHead", "PyThreadState_Next",
            "PyThreadState_GetFrame", "PyThreadState_Get", "Py_DecRef")
_C: list[Any] = []  # [the typed functions] once looked up, [None] where they cannot be
module_state.register(__name__, "_C", reset=False)


def _c_api() -> Any:
    """CPython's functions for :func:`waiting_for_the_gil`, typed once (calls keep the GIL)."""
    if not _C:
        try:
            lib = ctypes.PyDLL(None)
            for name in _C_NAMES:
                fn = getattr(lib, name)
                fn.restype = None if name == "Py_DecRef" else ctypes.c_void_p
                fn.argtypes = [] if name.endswith("_Get") else [ctypes.c_void_p]
        except (AttributeError, OSError):  # not CPython, or its symbols are not exported
            _C.append(None)
        else:
            _C.append(lib)
    return _C[0]


def let_go(tensors: Sequence[Any], holders: Sequence[int],
           timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
    """Wait, with the GIL released, until torch's threads hold none of ``tensors``.

    ``holders``: each tensor's ``_use_count()`` before the collective (its holders outside
    torch's threads). Call it once the collective's work was waited for and nothing of the
    caller holds the work. CPU tensors only (gloo; NCCL keeps its own works until its watchdog
    checks them, on its own schedule). Where torch does not count a tensor's holders, it waits
    for gloo's threads instead. False on timeout.
    """
    counted = [(t, n) for t, n in zip(tensors, holders)
               if getattr(t, "device", None) is not None and t.device.type == "cpu"]
    if not counted:
        return True
    if not all(callable(getattr(t, "_use_count", None)) for t, _ in counted):
        return settle_gloo_workers(timeout_s)
    deadline = time.monotonic() + timeout_s
    while any(t._use_count() > n for t, n in counted):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)  # releases the GIL: the worker that still holds one can free it
    return True


def holders(tensors: Sequence[Any]) -> list[int]:
    """Each tensor's holders now (``_use_count()``; 0 where torch does not count them)."""
    return [int(t._use_count()) if callable(getattr(t, "_use_count", None)) else 0
            for t in tensors]


def destroy_group(group: Any = None) -> None:
    """``torch.distributed.destroy_process_group(group)``, called through :func:`settled`."""
    dist = sys.modules["torch.distributed"]  # a group exists, so torch.distributed is loaded
    settled(dist.destroy_process_group, group)


def settled(destroy: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``destroy(*args, **kwargs)`` - torch's destroy_process_group, or a wrapper of it - once
    gloo's worker threads are idle, and a second wait after it (the interpreter may exit next,
    and threads of a group something else still holds live on)."""
    settle_gloo_workers()
    try:
        return destroy(*args, **kwargs)
    finally:
        settle_gloo_workers()


def settle_gloo_workers(timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
    """Wait, with the GIL released, until ProcessGroupGloo's worker threads are idle.

    Why: a gloo worker thread marks a collective complete *before* it drops its reference
    to the finished work; that drop frees the work's tensors (and, through a barrier's weak
    references, earlier works' tensors), which takes the GIL to release their Python
    objects. destroy_process_group() does not join these threads (only ~ProcessGroupGloo
    does, and DDP reducers, meshes, torch internals or a framework keep it alive until exit:
    after DeepSpeed's engine.destroy() and deepspeed.comm.destroy_process_group() one group's
    threads still run at exit, held by references the garbage collector cannot see), so on a loaded
    machine the drop can come after Py_FinalizeEx has started: CPython then ends the thread
    with pthread_exit inside a noexcept destructor and the process dies with "terminate
    called without an active exception" (SIGABRT). Open in torch: pytorch/pytorch#190489
    (same AsyncAllgatherWork stack) and #117762; the atexit fix #179291 was abandoned.
    torch before 2.11 gives these threads no name: there the wait is for no thread to be
    asking for the GIL (:func:`waiting_for_the_gil`) after one GIL-free pause, which sees a
    worker that drops its work late only once it asks.
    Returns False on timeout (then exit is no worse than without the wait).
    """
    tids = gloo_worker_tids()
    if not tids and "torch.distributed" not in sys.modules:
        return True  # no gloo group was ever possible: nothing to wait for
    return wait_idle(tids, timeout_s, quiet=lambda: waiting_for_the_gil() == 0)


def wait_idle(tids: list[str], timeout_s: float, quiet_s: float = 0.01,
              quiet: Callable[[], bool] = lambda: True) -> bool:
    """True once every thread in ``tids`` sleeps and was not woken during a GIL-free pause,
    and ``quiet()`` holds after that pause (at least one pause, even without threads).

    Idle gloo workers block on a condition variable with no timeout, so they neither run
    nor wake; a worker still finishing a work is runnable, or waits for the GIL (which it
    gets, and so wakes, while we sleep). Linux /proc only; elsewhere there is nothing to read.
    """
    deadline = time.monotonic() + timeout_s
    before = {tid: thread_activity(tid) for tid in tids}
    while True:
        time.sleep(quiet_s)  # releases the GIL, so a finishing worker can take it
        after = {tid: thread_activity(tid) for tid in tids}
        if all(a is None or (a == before[tid] and a[0] == "S") for tid, a in after.items()) \
                and quiet():
            return True
        if time.monotonic() >= deadline:
            return False
        before = after
