"""Let gloo's worker threads finish before the interpreter exits (a SIGABRT at exit otherwise).

Used by ``scaletrain.shutdown()`` and by the worker entry of ``scaletrain run`` once the user's
program has returned. Linux /proc only; elsewhere there is nothing to read and nothing waits.
Nothing here imports torch.
"""

from __future__ import annotations

import os
import time

SETTLE_TIMEOUT_S = 5.0
GLOO_WORKER = "pt_gloo_runloop"  # the name c10d gives ProcessGroupGloo's worker threads


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
    Returns False on timeout (then exit is no worse than without the wait).
    """
    return wait_idle(gloo_worker_tids(), timeout_s)


def wait_idle(tids: list[str], timeout_s: float, quiet_s: float = 0.01) -> bool:
    """True once every thread in ``tids`` sleeps and was not woken during a GIL-free pause.

    Idle gloo workers block on a condition variable with no timeout, so they neither run
    nor wake; a worker still finishing a work is runnable, or waits for the GIL (which it
    gets, and so wakes, while we sleep). Linux /proc only; elsewhere there is nothing to read.
    """
    if not tids:
        return True
    deadline = time.monotonic() + timeout_s
    before = {tid: thread_activity(tid) for tid in tids}
    while time.monotonic() < deadline:
        time.sleep(quiet_s)  # releases the GIL, so a finishing worker can take it
        after = {tid: thread_activity(tid) for tid in tids}
        if all(a is None or (a == before[tid] and a[0] == "S") for tid, a in after.items()):
            return True
        before = after
    return False
