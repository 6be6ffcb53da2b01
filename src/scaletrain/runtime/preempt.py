"""Stop on a signal at the same step on every rank: time limits and preemption.

A Slurm job learns that it must end from a signal: the generated scripts ask for
``--signal=B:USR1@<grace>`` (the batch shell relays USR1 to srun, srun to every task) some
minutes before the time limit, and a preempted job gets SIGTERM, then SIGKILL after the
partition's grace time. Python's default action for both is to die, losing everything since
the last checkpoint. :func:`install` (run by ``scaletrain.init()``) replaces it with a handler
that only *records* the request; the training loop then stops at a step boundary, saves and
exits with :data:`scaletrain.contract.environ.EXIT_STOPPED` so that the script requeues the job.

Ranks receive their signals at different moments, so a rank cannot stop on its own: its peers
would wait forever in the next collective. :class:`scaletrain.runtime.agreement.StopAgreement`
makes every rank stop at the same step; it reads this module's request (:func:`stop_code`) and
registers as a listener (:func:`add_listener`) while it polls.

Configure which signals stop and how they are named with ``init(stop_signals=...)`` or
``SCALETRAIN_STOP_SIGNALS="USR1:time_limit,TERM:preempted,USR2:requested"`` (the default;
``none`` installs nothing). USR2 is ``scaletrain cancel --save``: a --requeue script does not
requeue after it.
A process that never creates a ``StopAgreement`` (a script without a Checkpointer) keeps
the default behaviour: the first such signal still ends it, as before.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scaletrain import module_state
from scaletrain.contract.environ import DEFAULT_STOP_SIGNALS, EXIT_STOPPED, STOP_SIGNALS_VAR, format_stop_signals
from scaletrain.errors import UsageError

# The reasons a stop can have, in increasing urgency: when ranks disagree (one got USR1, another
# TERM), the reduction's MAX picks the most urgent. Code 0 means "no stop".
REASONS = ("requested", "time_limit", "preempted")
_CODE = {reason: i + 1 for i, reason in enumerate(REASONS)}
DEFAULT_SIGNALS: dict[str, str] = {"SIG" + name: reason for name, reason in DEFAULT_STOP_SIGNALS.items()}

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
module_state.register(__name__, "_installed", "_reasons", "_request", "_listeners", leak=True)


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
                             f'write it like "{format_stop_signals(DEFAULT_STOP_SIGNALS)}", or "none"')
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


def add_listener() -> None:
    """A :class:`~scaletrain.runtime.agreement.StopAgreement` now polls: signals are recorded."""
    global _listeners
    with _lock:
        _listeners += 1


def remove_listener() -> None:
    """One poller fewer; with none left, a stop signal ends the process again."""
    global _listeners
    with _lock:
        _listeners = max(0, _listeners - 1)


def stop_code() -> int:
    """This rank's pending stop as the number the agreement reduces (0: none; higher: more urgent)."""
    request_ = _request
    return _CODE[request_.reason] if request_ is not None else 0


def reason_of(code: int) -> str | None:
    """The reason a reduced stop code stands for (None for 0 or an unknown code)."""
    return REASONS[code - 1] if 1 <= code <= len(REASONS) else None


def _reset_for_tests() -> None:
    global _request, _listeners
    _request = None
    _listeners = 0


def stop_message(reason: str, step: int, directory: str | os.PathLike[str] | None = None) -> str:
    """The one line rank 0 logs when the job stops on purpose."""
    what = _WHAT.get(reason, reason)
    sig = signal_for(reason)
    where = f" in {directory}" if directory is not None else ""
    return (f"scaletrain: {what}{f' ({sig})' if sig else ''}: state saved at step {step}{where}; "
            f"exit code {EXIT_STOPPED}. A script from 'scaletrain plan --requeue' requeues "
            "itself; otherwise submit the job again: it resumes from this step")


def signal_for(reason: str) -> str:
    """The signal that asked for a stop with ``reason`` (``"SIGUSR1"``), or "" when unknown."""
    request_ = _request
    if request_ is not None and request_.reason == reason and request_.signal:
        return request_.signal
    for signum, name in _reasons.items():
        if name == reason:
            return signal.Signals(signum).name
    return ""
