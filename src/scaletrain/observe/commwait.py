"""Time each rank spends in DDP's gradient all-reduces, including the wait for slower ranks.

A data-parallel step ends with every rank meeting in the all-reduce, so step times are equal
on all ranks and a slow rank only shows as the others' *waiting*. :func:`attach` registers a
DDP communication hook that does what DDP's default hook does (average the bucket with an
asynchronous all-reduce) and records, per step, the time from the first bucket being handed to
the all-reduce until the last bucket's result arrives. A fast rank waits long, a straggler
hardly at all.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class CommWait:
    """Collects all-reduce wall time between :meth:`take` calls (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: float | None = None
        self._last: float | None = None

    def started(self) -> None:
        now = time.perf_counter()
        with self._lock:
            if self._first is None:
                self._first = now

    def finished(self) -> None:
        now = time.perf_counter()
        with self._lock:
            self._last = now

    def take(self) -> float | None:
        """Seconds from the first bucket sent to the last result, since the last call."""
        with self._lock:
            first, last = self._first, self._last
            self._first = self._last = None
        if first is None or last is None or last < first:
            return None
        return last - first


def attach(model: Any, timer: CommWait) -> bool:
    """Register the timing hook on a DDP-wrapped ``model``; False when it is not DDP.

    Call before the first forward pass (DDP accepts one hook, registered before training).
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return False
    import torch.distributed as dist

    group = model.process_group

    # no annotations: DDP rejects any but its own (dist.GradBucket), which are strings here
    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        timer.started()
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size(group))
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f):  # type: ignore[no-untyped-def]
            timer.finished()
            return f.value()[0]

        return fut.then(done)

    model.register_comm_hook(None, hook)
    return True
