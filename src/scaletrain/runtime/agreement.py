"""The stop agreement: every rank stops at the same step, without blocking the step path.

Ranks receive their stop signals at different moments (srun delivers them one node at a time,
a user may signal one process), so a rank cannot stop on its own: its peers would wait forever
in the next collective. :class:`StopAgreement` makes every rank stop at the same step: at a
sync step it starts an asynchronous ``all_reduce(MAX)`` of a few integers (this rank's stop
code from :mod:`scaletrain.runtime.preempt`, its mean step time, the caller's flags) and reads
the result of the *previous* sync's reduction, which finished long ago. Because every rank
reads the reduction of the same call index, all ranks see the same answer at the same call,
whichever rank was signalled and whenever. Syncs are spaced about half a second apart (a whole
number of steps, derived on every rank from the same reduced step time by the rule of
:mod:`scaletrain.runtime.cadence`, which the Monitor's exchange follows too), so the cost stays
invisible even when a step takes a fraction of a millisecond.
"""

from __future__ import annotations

import time
from typing import Any

from scaletrain.errors import UsageError
from scaletrain.runtime import preempt, timeouts
from scaletrain.runtime.cadence import STOP_PERIOD_S, stop_interval
from scaletrain.runtime.current import collective_device, group_rank_world

FLAG_BITS = 8  # poll(flags) carries bits 0..7; each travels as its own MAX, i.e. an OR
_SLOTS = 2 + FLAG_BITS  # [stop code, mean step time in us, flag bits...]
_MAX_STEP_US = 2**31 - 1
# Read by every new StopAgreement: set to 0 before creating one, it agrees at every step.
SYNC_PERIOD_S = STOP_PERIOD_S


class StopAgreement:
    """All ranks agree, late and without blocking, on whether to stop.

    Call :meth:`poll` exactly once per training step on every rank of ``group`` (default: the
    world). Every ``interval`` calls (a *sync* call) it reads the all-reduce started at the
    previous sync call and starts the next one; the result, ``(reason, flags)``, is the same on
    every rank at the same call index. Other calls return ``(None, 0)`` and cost nothing.

    The interval adapts so that a sync happens about every ``period_s`` seconds (default
    :data:`SYNC_PERIOD_S`): every rank contributes its mean step time, and all ranks derive
    the next interval from the same reduced value. A stop is thus seen at most about two
    periods (and at least one step) after the first rank was signalled - seconds, against the
    minutes of warning a time limit gives - while the collective's cost (a wake-up of gloo's
    or NCCL's thread) stays far below 1% even of a sub-millisecond step. ``period_s=0``
    agrees at every call.
    """

    def __init__(self, group: Any = None, *, period_s: float | None = None) -> None:
        self._group = group
        self._period = SYNC_PERIOD_S if period_s is None else max(0.0, float(period_s))
        self._work: Any = None
        self._buffer: Any = None      # the tensor being reduced (device for NCCL)
        self._host: Any = None        # where an NCCL result lands, pinned CPU memory
        self._event: Any = None       # marks the copy to _host done
        self._stream: Any = None      # NCCL: the side stream the flag travels on
        self._local: list[int] | None = None  # world size 1: the previous values
        self._distributed: bool | None = None
        self._interval = 1            # calls between syncs, the same on every rank
        self._calls = 0               # calls since the last sync
        self._flags = 0               # flags OR-ed since the last sync
        self._last_sync: float | None = None
        self._closed = False
        preempt.add_listener()

    @property
    def interval(self) -> int:
        """Calls between two agreements now (the same on every rank)."""
        return self._interval

    def close(self) -> None:
        """Wait for the last reduction and stop listening (a later signal ends the process)."""
        if self._closed:
            return
        self._closed = True
        if self._work is not None:
            try:
                self._work.wait()
            except Exception:  # the group may be gone at exit; nothing left to agree on
                pass
            self._work = None
        preempt.remove_listener()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _setup(self) -> None:
        self._distributed = group_rank_world(self._group)[1] > 1
        if not self._distributed:
            return
        import torch

        where = collective_device(self._group)
        if where != "cpu":
            device = torch.device(where)
            self._buffer = torch.zeros(_SLOTS, dtype=torch.int32, device=device)
            self._host = torch.zeros(_SLOTS, dtype=torch.int32, pin_memory=True)
            self._stream = torch.cuda.Stream(device=device)
            self._event = torch.cuda.Event()
        else:
            self._buffer = torch.zeros(_SLOTS, dtype=torch.int32)

    def poll(self, flags: int = 0) -> tuple[str | None, int]:
        """Contribute this rank's stop request and ``flags``; on a sync call return the result
        of the previous sync's reduction, else ``(None, 0)``.

        ``(None, 0)`` on the first call. ``flags`` is a bitmask of bits 0..7, OR-ed over the
        calls since the last sync and across ranks.
        """
        if isinstance(flags, bool) or not 0 <= int(flags) < (1 << FLAG_BITS):
            raise UsageError(f"StopAgreement.poll flags={flags!r} outside 0..{(1 << FLAG_BITS) - 1}",
                             f"use bits 0..{FLAG_BITS - 1}")
        if self._closed:
            raise UsageError("StopAgreement.poll() after close()", "create a new StopAgreement")
        # a poll follows a training step: collectives may use the shorter step timeout now
        # (idempotent; one flag test after the first call)
        timeouts.training_started()
        self._flags |= int(flags)
        self._calls += 1
        if self._calls < self._interval:
            return None, 0
        now = time.monotonic()
        step_us = (0 if self._last_sync is None
                   else min(int((now - self._last_sync) / self._calls * 1e6), _MAX_STEP_US))
        self._last_sync = now
        mine = [preempt.stop_code(), step_us] + \
            [(self._flags >> i) & 1 for i in range(FLAG_BITS)]
        self._calls, self._flags = 0, 0
        if self._distributed is None:
            self._setup()
        if not self._distributed:  # one rank: nothing to agree on, no collective
            previous, self._local = self._local, mine
        else:
            previous = self._collect()
            self._start(mine)
        if previous is None:
            return None, 0
        self._interval = stop_interval(previous[1], self._period)
        return _agreed(_decode(previous))

    def _collect(self) -> list[int] | None:
        if self._work is None:
            return None
        if self._event is not None:
            self._event.synchronize()  # the copy to pinned memory, queued a sync ago
            values = self._host.tolist()
        else:
            self._work.wait()  # finished on gloo's threads since the last sync: returns at once
            values = self._buffer.tolist()
        self._work = None
        return values

    def _start(self, values: list[int]) -> None:
        import torch
        import torch.distributed as dist

        if self._event is None:  # gloo/CPU: the reduction runs on gloo's threads
            self._buffer.copy_(torch.tensor(values, dtype=torch.int32))
            self._work = dist.all_reduce(self._buffer, op=dist.ReduceOp.MAX,
                                         group=self._group, async_op=True)
            return
        # NCCL: fill, reduce and copy back on a side stream, so nothing waits for the
        # step's kernels on the default stream and the host never blocks on this step.
        with torch.cuda.stream(self._stream):
            self._host.copy_(torch.tensor(values, dtype=torch.int32))
            self._buffer.copy_(self._host, non_blocking=True)
            self._work = dist.all_reduce(self._buffer, op=dist.ReduceOp.MAX,
                                         group=self._group, async_op=True)
            self._work.wait()  # makes the side stream wait for NCCL's; the host does not
            self._host.copy_(self._buffer, non_blocking=True)
            self._event.record(self._stream)


def _agreed(result: tuple[str | None, int]) -> tuple[str | None, int]:
    """Adopt an agreed stop as this rank's own request: a rank that got no signal is stopping
    too, and must not die by a later one (see :func:`uninstall`)."""
    if result[0] is not None:
        preempt.request(result[0])   # a no-op when this rank has its own request already
    return result


def _decode(values: list[int]) -> tuple[str | None, int]:
    code = values[0]
    flags = sum(1 << i for i, v in enumerate(values[2:]) if v)
    reason = preempt.reason_of(code)
    return reason, flags
