"""scaletrain run's stop-signal plumbing, without workers: which exits count as a stop on
purpose, how worker processes are found, and that the handlers are put back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from scaletrain.contract.environ import EXIT_STOPPED
from scaletrain.launch import signals
from scaletrain.launch.signals import Forwarding, forward_stop_signals, stop_outcome, worker_pids


def test_all_workers_stopped_on_purpose_is_exit_stopped():
    state = Forwarding(received=["SIGUSR1"])
    code, line = stop_outcome(state, [EXIT_STOPPED, EXIT_STOPPED])
    assert code == EXIT_STOPPED and "after SIGUSR1" in line and state.stopped


def test_any_other_exit_is_a_failure_not_a_stop():
    assert stop_outcome(Forwarding(), [EXIT_STOPPED, 1]) is None
    assert stop_outcome(Forwarding(), [EXIT_STOPPED, -signal.SIGKILL]) is None
    assert stop_outcome(Forwarding(), []) is None
    # killed by a SIGTERM nobody sent us: a failure as well
    assert stop_outcome(Forwarding(), [-signal.SIGTERM]) is None


def test_workers_killed_by_our_sigterm_are_a_stop_by_signal():
    state = Forwarding(received=["SIGTERM"])
    code, line = stop_outcome(state, [-signal.SIGTERM, 128 + signal.SIGTERM])
    assert code == 128 + signal.SIGTERM and "received SIGTERM" in line and not state.stopped


def test_worker_pids_are_the_children_with_torch_elastic_variables():
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0"}
    plain = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    worker = subprocess.Popen(sleep, env=env)
    other = subprocess.Popen(sleep, env=plain)
    try:
        assert worker.pid in worker_pids() and other.pid not in worker_pids()
    finally:
        for proc in (worker, other):
            proc.kill()
            proc.wait()


def test_handlers_are_restored_and_ignored_after_a_stop():
    before = {s: signal.getsignal(s) for s in (*signals.FORWARDED, signal.SIGALRM)}
    with forward_stop_signals() as state:
        assert all(signal.getsignal(s) is not before[s] for s in signals.FORWARDED)
    assert {s: signal.getsignal(s) for s in before} == before
    try:
        with forward_stop_signals() as state:
            stop_outcome(state, [EXIT_STOPPED])
        # the launcher is exiting with 75: a late TERM from srun must not kill it
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in signals.FORWARDED)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
