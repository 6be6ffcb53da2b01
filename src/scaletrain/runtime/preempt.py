"""Stop on a signal at the same step on every rank: time limits and preemption.

A Slurm job learns that it must end from a signal: the generated scripts ask for
``--signal=B:USR1@<grace>`` (the batch shell relays USR1 to srun, srun to every task) some
minutes before the time limit, and a preempted job gets SIGTERM, then SIGKILL after the
partition's grace time. Python's default action for both is to die, losing everything since
the last checkpoint. :func:`install` (run by ``scaletrain.init()``) replaces it with a handler
that only *records* the request; the training loop then stops at a step boundary, saves and
exits with :data:`scaletrain.contract.EXIT_STOPPED` so that the script requeues the job.

Ranks receive their signals at different moments (srun delivers them one node at a time, a
user may signal one process), so a rank cannot stop on its own: its peers would wait forever in
the next collective. :class:`StopAgreement` makes every rank stop at the same step: at a sync
step it starts an asynchronous ``all_reduce(MAX)`` of a few integers (this rank's stop code, its
mean step time, the caller's flags) and reads the result of the *previous* sync's reduction,
which finished long ago - no blocking wait on the step path. Because every rank reads the
reduction of the same call index, all ranks see the same answer at the same call, whichever
rank was signalled and whenever. Syncs are spaced about half a second apart (a whole number of
steps, derived on every rank from the same reduced step time), so the cost stays invisible even
when a step takes a fraction of a millisecond.

Configure which signals stop and how they are named with ``init(stop_signals=...)`` or
``SCALETRAIN_STOP_SIGNALS="USR1:time_limit,TERM:preempted"`` (``none`` installs nothing).
A process that never creates a :class:`StopAgreement` (a script without a Checkpointer) keeps
the default behaviour: the first such signal still ends it, as before.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.contract import EXIT_STOPPED, STOP_SIGNALS_VAR
from scaletrain.runtime import timeouts
from scaletrain.errors import UsageError
from scaletrain.fileio import atomic_write

# The reasons a stop can have, in increasing urgency: when ranks disagree (one got USR1, another
# TERM), the reduction's MAX picks the most urgent. Code 0 means "no stop".
REASONS = ("requested", "time_limit", "preempted")
_CODE = {reason: i + 1 for i, reason in enumerate(REASONS)}
DEFAULT_SIGNALS: dict[str, str] = {"SIGUSR1": "time_limit", "SIGTERM": "preempted"}
FLAG_BITS = 8  # poll(flags) carries bits 0..7; each travels as its own MAX, i.e. an OR
_SLOTS = 2 + FLAG_BITS  # [stop code, mean step time in us, flag bits...]
_MAX_STEP_US = 2**31 - 1
# The agreement's all-reduce runs about this often (an interval of whole steps): rare enough
# that its cost is invisible even on a tiny model, often enough to stop within a second or two.
SYNC_PERIOD_S = 0.5
MAX_INTERVAL = 10_000
STOP_RECORD = "stop.json"

# How the log line names each reason.
_WHAT = {"time_limit": "time limit near", "preempted": "job preempted",
         "requested": "stop requested"}


@dataclass(frozen=True)
class _Request:
    reason: str
    signal: str          # e.g. "SIGUSR1"
    monotonic: float


_lock = threading.Lock()
_installed: dict[int, Any] = {}      # signal number -> the handler it replaced
_reasons: dict[int, str] = {}        # signal number -> reason, while installed
_request: _Request | None = None
_listeners = 0                       # live StopAgreements: someone will act on a request


def parse_signals(text: str) -> dict[str, str]:
    """``"USR1:time_limit,TERM:preempted"`` -> ``{"SIGUSR1": "time_limit", ...}``; ``none`` -> {}."""
    value = text.strip()
    if value.lower() in ("none", "off", "0"):
        return {}
    mapping: dict[str, str] = {}
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, reason = item.partition(":")
        if not sep:
            raise UsageError(f"{STOP_SIGNALS_VAR}: {item!r} is not SIGNAL:REASON",
                             'write it like "USR1:time_limit,TERM:preempted", or "none"')
        mapping[name.strip()] = reason.strip()
    return mapping


def resolve(signals: Mapping[str, str] | str | None) -> dict[str, str]:
    """The stop signals asked for, checked: an argument (mapping or text), else
    ``SCALETRAIN_STOP_SIGNALS``, else the default. Raises UsageError on a bad name or reason."""
    if signals is None:
        text = os.environ.get(STOP_SIGNALS_VAR)
        signals = parse_signals(text) if text is not None else DEFAULT_SIGNALS
    elif isinstance(signals, str):
        signals = parse_signals(signals)
    return {signal.Signals(n).name: r for n, r in _normalise(signals).items()}


def _normalise(signals: Mapping[str, str]) -> dict[int, str]:
    """Signal names -> numbers, reasons checked; SIGINT and SIGKILL are refused."""
    out: dict[int, str] = {}
    for name, reason in signals.items():
        upper = str(name).strip().upper()
        full = upper if upper.startswith("SIG") else "SIG" + upper
        number = getattr(signal, full, None)
        if not isinstance(number, signal.Signals):
            raise UsageError(f"stop signal {name!r} is not a signal name",
                             "use a name like USR1, USR2 or TERM")
        if number in (signal.SIGINT, signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(f"{full} cannot be a stop signal",
                             "use USR1, USR2 or TERM (Ctrl-C stays an interrupt)")
        if reason not in _CODE:
            raise UsageError(f"stop reason {reason!r} for {full} is not one of "
                             f"{', '.join(REASONS)}", f"e.g. {full[3:]}:time_limit")
        out[int(number)] = reason
    return out


def _handler(signum: int, frame: Any) -> None:
    """Record the first request; never raises, never saves (Python runs this between bytecodes
    of the main thread, so the step in progress is finished before anyone acts on it)."""
    global _request
    try:
        if _request is not None:
            return  # a second signal (srun and the agent both forward it) changes nothing
        reason = _reasons.get(signum)
        if reason is None:
            return
        if _listeners == 0:
            # Nobody polls: behave as if we were never installed (die by the old action).
            _restore(signum)
            os.kill(os.getpid(), signum)
            return
        _request = _Request(reason, signal.Signals(signum).name, time.monotonic())
    except Exception:  # a signal handler must not turn into an exception in user code
        pass


def _restore(signum: int) -> None:
    previous = _installed.pop(signum, signal.SIG_DFL)
    _reasons.pop(signum, None)
    try:
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
    except (ValueError, OSError, TypeError):
        pass


def install(signals: Mapping[str, str] | str | None = None) -> None:
    """Handle the stop signals in this process: record the request, act at a step boundary.

    ``signals`` maps signal names to reasons (``"time_limit"``, ``"preempted"``,
    ``"requested"``); default: ``SCALETRAIN_STOP_SIGNALS`` if set, else USR1 -> time_limit and
    TERM -> preempted. Idempotent; a no-op outside the main thread (Python only lets the
    main thread set handlers). SIGINT stays Python's KeyboardInterrupt.
    """
    wanted = _normalise(resolve(signals))
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        for signum in list(_installed):
            if signum not in wanted:
                _restore(signum)
        for signum, reason in wanted.items():
            if signum not in _installed:
                previous = signal.signal(signum, _handler)
                _installed[signum] = previous
            _reasons[signum] = reason


def uninstall() -> None:
    """Put back the handlers :func:`install` replaced (run by ``scaletrain.shutdown()``).

    While a stop is pending the signals are ignored instead: the process is exiting with
    EXIT_STOPPED after saving, and a repeated signal (torch's agent stops the other workers
    with SIGTERM once one has exited) must not turn that clean stop into a death by signal.
    (A Python handler would not do: the interpreter resets those to the default action
    while it finalizes; an ignored signal stays ignored.)
    """
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        for signum in list(_installed):
            if _request is not None:
                _installed[signum] = signal.SIG_IGN
            _restore(signum)


def installed() -> dict[str, str]:
    """The signals handled now, as ``{"SIGUSR1": "time_limit", ...}``."""
    return {signal.Signals(s).name: r for s, r in _reasons.items()}


def requested() -> str | None:
    """This rank's pending stop reason (no collective), or None."""
    request = _request
    return request.reason if request is not None else None


def requested_by() -> str | None:
    """The signal that asked this rank to stop (``"SIGUSR1"``), ``""`` when the stop came from
    :func:`request` or from another rank through the agreement, None when none is pending."""
    request_ = _request
    return request_.signal if request_ is not None else None


def request(reason: str = "requested") -> None:
    """Ask for a stop from code (same effect as a signal on this rank)."""
    global _request
    if reason not in _CODE:
        raise UsageError(f"stop reason {reason!r} is not one of {', '.join(REASONS)}",
                         "use 'requested'")
    if _request is None:
        _request = _Request(reason, "", time.monotonic())


def _reset_for_tests() -> None:
    global _request, _listeners
    _request = None
    _listeners = 0


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
        global _listeners
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
        with _lock:
            _listeners += 1

    @property
    def interval(self) -> int:
        """Calls between two agreements now (the same on every rank)."""
        return self._interval

    def close(self) -> None:
        """Wait for the last reduction and stop listening (a later signal ends the process)."""
        global _listeners
        if self._closed:
            return
        self._closed = True
        if self._work is not None:
            try:
                self._work.wait()
            except Exception:  # the group may be gone at exit; nothing left to agree on
                pass
            self._work = None
        with _lock:
            _listeners = max(0, _listeners - 1)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _setup(self) -> None:
        dist = sys.modules.get("torch.distributed")
        self._distributed = bool(dist is not None and dist.is_available()
                                 and dist.is_initialized()
                                 and dist.get_world_size(self._group) > 1)
        if not self._distributed:
            return
        import torch

        assert dist is not None  # poll() runs only with a process group
        backend = str(dist.get_backend(self._group)).lower()
        if "nccl" in backend and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
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
        mine = [_CODE[_request.reason] if _request is not None else 0, step_us] + \
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
        self._interval = _interval(previous[1], self._period)
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


def _interval(step_us: int, period_s: float) -> int:
    """Calls between syncs for a (reduced, slowest-rank) mean step of ``step_us``."""
    if step_us <= 0 or period_s <= 0:
        return 1
    return max(1, min(MAX_INTERVAL, int(period_s * 1e6 // step_us)))


def _agreed(result: tuple[str | None, int]) -> tuple[str | None, int]:
    """Adopt an agreed stop as this rank's own request: a rank that got no signal is stopping
    too, and must not die by a later one (see :func:`uninstall`)."""
    global _request
    if result[0] is not None and _request is None:
        _request = _Request(result[0], "", time.monotonic())
    return result


def _decode(values: list[int]) -> tuple[str | None, int]:
    code = values[0]
    flags = sum(1 << i for i, v in enumerate(values[2:]) if v)
    reason = REASONS[code - 1] if 1 <= code <= len(REASONS) else None
    return reason, flags


def stop_message(reason: str, step: int, directory: str | os.PathLike[str] | None = None) -> str:
    """The one line rank 0 logs when the job stops on purpose."""
    what = _WHAT.get(reason, reason)
    sig = _signal_for(reason)
    where = f" in {directory}" if directory is not None else ""
    return (f"scaletrain: {what}{f' ({sig})' if sig else ''}: state saved at step {step}{where}; "
            f"exit code {EXIT_STOPPED}. A script from 'scaletrain plan --requeue' requeues "
            "itself; otherwise submit the job again: it resumes from this step")


def _signal_for(reason: str) -> str:
    request_ = _request
    if request_ is not None and request_.reason == reason and request_.signal:
        return request_.signal
    for signum, name in _reasons.items():
        if name == reason:
            return signal.Signals(signum).name
    return ""


def write_stop_record(directory: str | os.PathLike[str], *, reason: str, step: int,
                      log: bool = True) -> Path:
    """Write ``stop.json`` (why, step, time, signal, ranks, restarts) atomically; returns its path.

    Called on rank 0 by the Checkpointer once the stop's checkpoint is committed; also logs
    :func:`stop_message` on stderr unless ``log=False``.
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    dist = sys.modules.get("torch.distributed")
    ranks = (dist.get_world_size() if dist is not None and dist.is_available()
             and dist.is_initialized() else 1)
    restart = os.environ.get("SLURM_RESTART_COUNT", "0").strip()
    record = {
        "reason": reason,
        "step": int(step),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "signal": _signal_for(reason) or None,
        "rank_count": ranks,
        "restart_count": int(restart) if restart.isdigit() else 0,
    }
    path = atomic_write(folder / STOP_RECORD, json.dumps(record, indent=2) + "\n")
    if log:
        print(stop_message(reason, step, folder), file=sys.stderr, flush=True)
    return path
