"""Stop signals in ``scaletrain run``: pass them to the workers and give them time to save.

torch's elastic agent turns SIGTERM, SIGINT, SIGHUP and SIGQUIT into "kill the workers"
(SIGTERM to each, SIGKILL after its shutdown timeout) and does not forward SIGUSR1/SIGUSR2 at
all - and its workers run in sessions of their own, so a signal sent to the agent's process
group never reaches them. Under Slurm, USR1 (``--signal=B:USR1@grace``) means "the time limit
is near" and SIGTERM "preempted"; the workers must get them and stay alive long enough to
reach a step boundary, agree, save and exit with :data:`~scaletrain.contract.environ.EXIT_STOPPED`.

So, while the workers run:
- USR1 and USR2 are forwarded to every worker; the agent keeps waiting.
- The first SIGTERM is forwarded too (torch is told not to handle it: the agent's
  ``LaunchConfig.signals_to_handle`` is :data:`TORCH_SIGNALS`); the workers get
  :data:`STOP_TIMEOUT_S` to stop by themselves, then the agent's usual shutdown runs
  (SIGTERM, then SIGKILL after its shutdown timeout). A second SIGTERM runs it at once.
- SIGINT (Ctrl-C), SIGHUP and SIGQUIT stay torch's: stop now.
When every worker that ended early exited with EXIT_STOPPED, ``scaletrain run`` exits with it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from scaletrain.contract.environ import EXIT_STOPPED, FORWARDED_SIGNALS
from scaletrain.launch.reaper import children, send
from scaletrain.launch.rundir import environ_of

FORWARDED = tuple(signal.Signals["SIG" + name] for name in FORWARDED_SIGNALS)
# Seconds the workers get after a forwarded SIGTERM to save and exit on their own, before the
# agent's shutdown (SIGTERM again, SIGKILL SHUTDOWN_TIMEOUT_S later). Slurm's KillWait and a
# preemption's GraceTime usually end the job sooner; this bounds a local `kill`.
STOP_TIMEOUT_S = 120.0
# After a SIGTERM that finds no worker: long enough for the agent to notice exited workers.
NO_WORKER_WAIT_S = 5.0
# The signals torch's agent may turn into "stop the workers now" (LaunchConfig.signals_to_handle):
# its default less SIGTERM, which forward_stop_signals handles.
TORCH_SIGNALS = "SIGINT,SIGHUP,SIGQUIT"


@dataclass
class Forwarding:
    """What the launcher's handlers saw: the signals received and forwarded."""

    received: list[str] = field(default_factory=list)
    stop_timeout_s: float = STOP_TIMEOUT_S
    stopped: bool = False  # the workers stopped on purpose: ignore stop signals until exit
    # the workers whose program has returned (set once the run folder exists): a save request
    # (USR1, USR2) has nothing to save there, and in the interpreter's exit it would kill them
    finished: Callable[[], set[int]] = field(default=lambda: set())


def worker_pids(parent: int | None = None) -> list[int]:
    """The agent's worker processes: children of this process started with torch's contract."""
    found = []
    for pid in sorted(children(parent if parent is not None else os.getpid())):
        # environ_of: a worker caught inside its exec shows no environment for a moment
        if any(item.startswith(b"TORCHELASTIC_RUN_ID=") for item in environ_of(pid)):
            found.append(pid)
    return found


def _agent_shutdown(signum: int) -> None:
    """What torch's own handler does: make the agent stop its workers now."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    raise SignalException(f"Process {os.getpid()} got signal: {signum}",
                          sigval=signal.Signals(signum))


@contextmanager
def forward_stop_signals(stop_timeout_s: float = STOP_TIMEOUT_S) -> Iterator[Forwarding]:
    """Install the launcher's forwarding handlers (main thread only) and undo them after."""
    state = Forwarding(stop_timeout_s=stop_timeout_s)
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def on_signal(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        again = name in state.received
        state.received.append(name)
        pids = worker_pids()
        done = state.finished() if signum != signal.SIGTERM else set()
        if done & set(pids):
            pids = [pid for pid in pids if pid not in done]
            if not again:
                print(f"scaletrain: received {name}; not passed to the workers that finished "
                      "their program (nothing left to save)", file=sys.stderr, flush=True)
            if not pids:
                return
        if signum == signal.SIGTERM:
            if again:  # asked twice: stop now
                _agent_shutdown(signum)
            # No worker alive: not started yet, or all exited and the agent has not looked yet
            # (srun's --kill-on-bad-exit sends TERM once another node's task exited 75).
            wait_s = state.stop_timeout_s if pids else min(state.stop_timeout_s, NO_WORKER_WAIT_S)
            signal.setitimer(signal.ITIMER_REAL, max(wait_s, 0.001))
        if not again:
            print(f"scaletrain: received {name}; passing it to the workers so they can save "
                  "and stop", file=sys.stderr, flush=True)
        send(pids, signum)

    def on_alarm(signum: int, frame: Any) -> None:
        print(f"scaletrain: the workers did not stop within {state.stop_timeout_s:g} s of "
              "SIGTERM; stopping them", file=sys.stderr, flush=True)
        _agent_shutdown(signal.SIGTERM)

    saved = {s: signal.getsignal(s) for s in (*FORWARDED, signal.SIGALRM)}
    try:
        for s in FORWARDED:
            signal.signal(s, on_signal)
        signal.signal(signal.SIGALRM, on_alarm)
        yield state
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in saved.items():
            if state.stopped and s in FORWARDED:
                # Exiting with EXIT_STOPPED: a late TERM (srun stopping the step once another
                # node's task exited 75) must not turn it into a death by signal.
                handler = signal.SIG_IGN
            try:
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
            except (ValueError, TypeError):
                pass


def stop_outcome(state: Forwarding, exit_codes: Iterable[int]) -> tuple[int, str] | None:
    """``(exit code, line)`` for ``scaletrain run`` when its workers ended because of a stop,
    None when they failed on their own (then the failure report applies).

    Every worker that ended early exited with EXIT_STOPPED: they saved on purpose; pass 75 on.
    Workers killed by a SIGTERM we forwarded (a script without a Checkpointer dies by it, as
    under torchrun): the launcher was stopped, 128+15, not a worker failure.
    """
    codes = list(exit_codes)
    if not codes:
        return None
    if all(code == EXIT_STOPPED for code in codes):
        state.stopped = True
        why = f" after {state.received[0]}" if state.received else ""
        return EXIT_STOPPED, (f"scaletrain: the workers saved and stopped on purpose{why}; exit "
                              f"code {EXIT_STOPPED} (run again to resume; a script from "
                              "'plan --requeue' requeues itself)")
    term = int(signal.SIGTERM)
    if "SIGTERM" in state.received and all(c in (-term, 128 + term, EXIT_STOPPED) for c in codes):
        return 128 + term, "scaletrain: received SIGTERM; stopped the workers"
    for name in dict.fromkeys(state.received):   # USR1, USR2: a worker without a handler dies
        sig = int(signal.Signals[name])
        if sig != term and all(c in (-sig, 128 + sig, EXIT_STOPPED) for c in codes):
            return 128 + sig, (f"scaletrain: received {name}; the workers had no handler for it "
                               "(a program without a stop handler, or one still starting) and "
                               "ended by it: stopped, not failed")
    return None
