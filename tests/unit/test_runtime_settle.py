"""shutdown() waits for gloo's worker threads before the interpreter may exit (SIGABRT flake)."""

from __future__ import annotations

import sys
import threading

import pytest

from scaletrain.runtime import init as rt
from scaletrain.runtime.settle import gloo_worker_tids, settle_gloo_workers, thread_activity, wait_idle

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _tid() -> str:
    return str(threading.get_native_id())


def test_busy_thread_is_not_idle_and_blocked_thread_is():
    stop, parked = threading.Event(), threading.Event()
    tid: list[str] = []

    def spin():
        tid.append(_tid())
        while not stop.is_set():
            pass  # runnable, competes for the GIL: never "idle"
        parked.wait()  # blocks on a lock with no timeout: idle

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    while not tid:
        pass
    try:
        assert wait_idle(tid, timeout_s=0.3) is False
        stop.set()
        assert wait_idle(tid, timeout_s=5.0) is True
    finally:
        stop.set()
        parked.set()
        t.join()


def test_gone_thread_counts_as_idle():
    assert thread_activity("999999999") is None
    assert wait_idle(["999999999"], timeout_s=0.1) is True


def test_shutdown_leaves_no_busy_gloo_worker(clean_env):
    import torch
    import torch.distributed as dist

    env = rt.init(device="cpu")
    assert env.world_size == 1
    t = torch.ones(4)
    dist.all_gather_object([None], {"x": 1})
    dist.all_reduce(t)
    dist.barrier()
    if not gloo_worker_tids():  # a feature of torch, not of scaletrain (docs/torch-support.md)
        rt.shutdown()
        pytest.skip("this torch does not name gloo's worker threads pt_gloo_runloop (torch 2.11 "
                    "and newer do): the wait watches for a thread asking for the GIL instead "
                    "(tests/unit/test_group_teardown.py)")
    rt.shutdown()
    assert not dist.is_initialized()
    assert settle_gloo_workers(timeout_s=0.5) is True
