"""Stop signals inside one process: parsing, the handler, the agreement at world size 1,
stop.json, and init()/shutdown() installing and restoring the handlers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from scaletrain.checkpoint.stoprecord import write_stop_record
from scaletrain.contract.environ import EXIT_STOPPED, STOP_SIGNALS_VAR
from scaletrain.errors import UsageError
from scaletrain.runtime import preempt
from scaletrain.runtime.agreement import StopAgreement


@pytest.fixture
def handlers():
    """Signal handlers and the module's request are as before after the test."""
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
    preempt._reset_for_tests()
    yield
    preempt._reset_for_tests()
    preempt.uninstall()
    for s, h in before.items():
        signal.signal(s, h)


def test_parse_and_resolve(clean_env):
    assert preempt.parse_signals("USR1:time_limit, TERM:preempted") == \
        {"USR1": "time_limit", "TERM": "preempted"}
    assert preempt.parse_signals("none") == {}
    assert preempt.resolve(None) == {"SIGUSR1": "time_limit", "SIGTERM": "preempted", "SIGUSR2": "requested"}
    assert preempt.resolve("sigusr2:requested") == {"SIGUSR2": "requested"}
    assert preempt.resolve({"TERM": "time_limit"}) == {"SIGTERM": "time_limit"}
    clean_env.setenv(STOP_SIGNALS_VAR, "USR2:preempted")
    assert preempt.resolve(None) == {"SIGUSR2": "preempted"}
    clean_env.setenv(STOP_SIGNALS_VAR, "none")
    assert preempt.resolve(None) == {}


@pytest.mark.parametrize("text, match", [
    ("USR1", "not SIGNAL:REASON"),
    ("BOGUS:time_limit", "not a signal name"),
    ("INT:time_limit", "cannot be a stop signal"),
    ("KILL:preempted", "cannot be a stop signal"),
    ("USR1:lunch", "not one of requested, time_limit, preempted"),
])
def test_bad_signal_specs_are_usage_errors(text, match):
    with pytest.raises(UsageError, match=match) as err:
        preempt.resolve(text)
    assert err.value.hint


def test_handler_records_first_request_only(handlers):
    preempt.install()
    assert preempt.installed() == {"SIGUSR1": "time_limit", "SIGTERM": "preempted", "SIGUSR2": "requested"}
    agreement = StopAgreement()
    try:
        assert preempt.requested() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert preempt.requested() == "time_limit" and preempt.requested_by() == "SIGUSR1"
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal changes nothing
        assert preempt.requested() == "time_limit"
    finally:
        agreement.close()


def test_install_is_idempotent_and_uninstall_restores(handlers):
    seen = []

    def mine(signum, frame):
        seen.append(signum)

    signal.signal(signal.SIGUSR1, mine)
    preempt.install({"USR1": "time_limit"})
    preempt.install({"USR1": "time_limit"})  # a second install must not remember itself
    assert signal.getsignal(signal.SIGUSR1) is preempt._handler
    assert signal.getsignal(signal.SIGTERM) is not preempt._handler
    preempt.install({"USR2": "requested"})  # a new choice releases USR1
    assert signal.getsignal(signal.SIGUSR1) is mine
    preempt.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is not preempt._handler
    os.kill(os.getpid(), signal.SIGUSR1)
    assert seen == [signal.SIGUSR1]


def test_a_pending_stop_keeps_ignoring_repeats_through_shutdown(handlers):
    preempt.install()
    agreement = StopAgreement()
    preempt.request("time_limit")
    agreement.close()
    preempt.uninstall()  # as scaletrain.shutdown() does while the process exits with 75
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGTERM)  # the agent stopping the other workers: survives
    assert preempt.requested() == "time_limit"


def test_without_a_listener_the_signal_keeps_its_default_action(tmp_path):
    """A script that never polls (no Checkpointer) must still die on SIGTERM, as before."""
    code = textwrap.dedent("""
        import os, signal, sys, time
        from scaletrain.runtime import preempt
        from scaletrain.runtime.agreement import StopAgreement
        preempt.install()
        if sys.argv[1] == "listen":
            agreement = StopAgreement()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print(preempt.requested())
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop(STOP_SIGNALS_VAR, None)
    bare = subprocess.run([sys.executable, "-c", code, "bare"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert bare.returncode == -signal.SIGTERM, bare.stderr
    listen = subprocess.run([sys.executable, "-c", code, "listen"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert listen.returncode == 0, listen.stderr
    assert listen.stdout.strip() == "preempted"


def test_agreement_at_world_size_one_is_one_step_late(handlers):
    agreement = StopAgreement(period_s=0)  # agree at every call
    try:
        assert agreement.poll(flags=1) == (None, 0)  # first call: nothing reduced yet
        assert agreement.poll() == (None, 1)          # the previous call's flags
        preempt.request("preempted")
        assert agreement.poll(flags=4) == (None, 0)
        assert agreement.poll() == ("preempted", 4)
        assert preempt.requested_by() == ""
        with pytest.raises(UsageError, match="flags"):
            agreement.poll(flags=256)
    finally:
        agreement.close()
    with pytest.raises(UsageError, match="after close"):
        agreement.poll()


def test_sync_interval_follows_the_step_time(handlers, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(preempt.time, "monotonic", lambda: clock[0])
    agreement = StopAgreement(period_s=0.1)
    results = []
    try:
        for call in range(40):
            clock[0] += 0.01                      # 10 ms steps
            if call == 20:
                preempt.request("time_limit")
            results.append((agreement.poll(flags=2 if call == 14 else 0), agreement.interval))
    finally:
        agreement.close()
    assert results[0] == ((None, 0), 1) and results[1] == ((None, 0), 1)
    assert results[2][1] == 10                     # 0.1 s / 10 ms, from the reduced step time
    # syncs at calls 0, 1, 2, 12, 22, 32: the flag of call 14 and the request of call 20 are
    # contributed at the sync of call 22 and seen at the next one, call 32
    seen = {i: r for i, (r, _) in enumerate(results) if r != (None, 0)}
    assert seen == {32: ("time_limit", 2)}


def test_stop_record_and_message(tmp_path, handlers, clean_env, capsys):
    clean_env.setenv("SLURM_RESTART_COUNT", "2")
    preempt.install()
    path = write_stop_record(tmp_path / "ckpt", reason="time_limit", step=1234)
    record = json.loads(path.read_text())
    assert path.name == "stop.json"
    assert record["reason"] == "time_limit" and record["step"] == 1234
    assert record["signal"] == "SIGUSR1" and record["restart_count"] == 2
    assert record["rank_count"] == 1 and record["time"].endswith("+00:00")
    err = capsys.readouterr().err
    assert "time limit near (SIGUSR1): state saved at step 1234" in err
    assert f"exit code {EXIT_STOPPED}" in err
    write_stop_record(tmp_path / "ckpt", reason="preempted", step=7, log=False)
    assert json.loads(path.read_text())["signal"] == "SIGTERM"
    assert "preempted" in preempt.stop_message("preempted", 7)
    assert list((tmp_path / "ckpt").iterdir()) == [path]  # no temporary file left


def test_init_installs_and_shutdown_restores(handlers, clean_env):
    pytest.importorskip("torch")
    from scaletrain.runtime.init import init, shutdown

    clean_env.setenv("SCALETRAIN_DEVICE", "cpu")
    before = signal.getsignal(signal.SIGUSR2)
    with pytest.raises(UsageError, match="not a signal name"):
        init(stop_signals="NOPE:time_limit")
    try:
        init(stop_signals="USR2:requested")
        assert preempt.installed() == {"SIGUSR2": "requested"}
        assert signal.getsignal(signal.SIGUSR2) is preempt._handler
    finally:
        shutdown()
    assert signal.getsignal(signal.SIGUSR2) is before
    assert preempt.installed() == {}
