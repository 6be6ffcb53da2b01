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


def _worker(code: str) -> subprocess.Popen:
    """A child that looks like one of the agent's workers, once it is up."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TORCHELASTIC_RUN_ID": "x"})
    proc.stdout.readline()
    return proc


IGNORES_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('up', flush=True); time.sleep(60)")
NO_HANDLER = "import time; print('up', flush=True); time.sleep(60)"


def test_a_sigterm_the_workers_do_not_obey_stops_them_after_the_wait():
    import time

    from torch.distributed.elastic.multiprocessing.api import SignalException

    worker = _worker(IGNORES_TERM)
    got = None
    try:
        with forward_stop_signals(stop_timeout_s=0.5) as state:
            state.finished = lambda: {worker.pid}   # a finished program still gets a TERM
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    time.sleep(0.05)
            except SignalException as exc:   # the agent's shutdown, after the wait
                got = exc.sigval
    finally:
        worker.kill()
        worker.wait()
        worker.stdout.close()
    assert got == signal.SIGTERM


def test_a_save_request_goes_only_to_workers_still_in_their_program(capsys):
    finished, training = _worker(NO_HANDLER), _worker(IGNORES_TERM.replace("SIGTERM", "SIGUSR1"))
    try:
        with forward_stop_signals() as state:
            state.finished = lambda: {finished.pid}
            os.kill(os.getpid(), signal.SIGUSR1)
        assert finished.poll() is None   # before: killed in its exit by the USR1 passed on
        assert state.received == ["SIGUSR1"]
        assert "not passed to the workers that finished their program" in capsys.readouterr().err
    finally:
        for proc in (finished, training):
            proc.kill()
            proc.wait()
            proc.stdout.close()
