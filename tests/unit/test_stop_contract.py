"""The stop signals are decided once, in scaletrain.contract.environ (issue 20): the batch script's
header and traps, the launcher's forwarding and the runtime's default handlers all follow it."""

from __future__ import annotations

import signal

from helpers import render_for

from scaletrain.contract import environ
from scaletrain.launch import signals as launch_signals
from scaletrain.runtime import preempt


def test_runtime_default_handlers_follow_the_contract(clean_env):
    assert environ.DEFAULT_STOP_SIGNALS == {environ.TIME_LIMIT_SIGNAL: "time_limit",
                                            environ.PREEMPT_SIGNAL: "preempted",
                                            environ.SAVE_AND_STOP_SIGNAL: "requested"}
    assert preempt.resolve(None) == {f"SIG{name}": reason for name, reason in environ.DEFAULT_STOP_SIGNALS.items()}
    text = environ.format_stop_signals(environ.DEFAULT_STOP_SIGNALS)
    assert text == "USR1:time_limit,TERM:preempted,USR2:requested"
    assert preempt.resolve(text) == preempt.resolve(None)  # the variable's form reads back the same


def test_launcher_forwards_the_contracts_signals():
    assert tuple(s.name for s in launch_signals.FORWARDED) == tuple(f"SIG{n}" for n in environ.FORWARDED_SIGNALS)
    assert environ.TIME_LIMIT_SIGNAL in environ.FORWARDED_SIGNALS
    assert environ.PREEMPT_SIGNAL in environ.FORWARDED_SIGNALS
    assert all(isinstance(s, signal.Signals) for s in launch_signals.FORWARDED)


def test_batch_script_asks_for_and_relays_the_contracts_signals():
    script = render_for("roihu", gpus=4, requeue=True, time="04:00:00")
    assert f"#SBATCH --signal=B:{environ.TIME_LIMIT_SIGNAL}@" in script
    for name in (environ.TIME_LIMIT_SIGNAL, environ.PREEMPT_SIGNAL):
        assert f"trap '_scaletrain_stop {name}' {name}" in script
    save = environ.SAVE_AND_STOP_SIGNAL   # scaletrain cancel --save: stop, and no requeue after it
    assert f"trap '_scaletrain_keep=1; _scaletrain_stop {save}' {save}" in script
