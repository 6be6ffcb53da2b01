"""One rule spaces the per-step exchanges: the stop agreement's and the Monitor's.

Both run every N steps, N about one period at the slowest rank's step time, derived on every
rank from the figures the last exchange shared (runtime/cadence.py).
"""

from __future__ import annotations

import pytest

from scaletrain.observe.monitor import Monitor
from scaletrain.runtime import agreement, cadence, preempt
from scaletrain.runtime.agreement import StopAgreement


def test_sync_interval_is_a_period_of_steps_within_bounds():
    assert cadence.sync_interval(10_000, 0.1, most=100) == 10       # 0.1 s of 10 ms steps
    assert cadence.sync_interval(9_999, 0.1, most=100) == 10        # whole steps, rounded down
    assert cadence.sync_interval(1, 0.5, most=1_000) == 1_000       # never further than `most`
    assert cadence.sync_interval(900_000, 0.5, least=3, most=9) == 3  # never closer than `least`
    assert cadence.sync_interval(0, 0.5, least=2, most=9) == 2      # no step time yet
    assert cadence.sync_interval(10_000, 0, least=4, most=9) == 4   # period 0: every `least`


def test_stop_agreement_interval():
    assert cadence.stop_interval(1_000, cadence.STOP_PERIOD_S) == 500
    assert cadence.stop_interval(1, cadence.STOP_PERIOD_S) == cadence.STOP_MAX_STEPS
    assert cadence.stop_interval(2_000_000, cadence.STOP_PERIOD_S) == 1   # slow steps: every step
    assert cadence.stop_interval(1_000, 0) == 1
    assert agreement.SYNC_PERIOD_S == cadence.STOP_PERIOD_S


def test_monitor_interval():
    every = cadence.MONITOR_EVERY
    assert cadence.monitor_interval(0.001, every, spaced=True) == 1_000   # ~1 s of 1 ms steps
    assert cadence.monitor_interval(0.001, every, spaced=False) == every  # every= given: exact
    assert cadence.monitor_interval(0.5, every, spaced=True) == every     # slow steps: `every`
    assert cadence.monitor_interval(0.0, every, spaced=True) == cadence.MONITOR_SPREAD * every
    assert cadence.monitor_interval(1e-6, 7, spaced=True) == cadence.MONITOR_SPREAD * 7


@pytest.fixture
def rule(monkeypatch):
    """Record every call of the shared rule (both users look it up in cadence at call time)."""
    calls: list[tuple[float, float, int, int]] = []
    real = cadence.sync_interval

    def spy(step_us, period_s, *, least=1, most):
        calls.append((step_us, period_s, least, most))
        return real(step_us, period_s, least=least, most=most)

    monkeypatch.setattr(cadence, "sync_interval", spy)
    return calls


def test_both_exchanges_follow_the_one_rule(rule, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(preempt.time, "monotonic", lambda: clock[0])
    stop = StopAgreement(period_s=0.1)
    try:
        for _ in range(3):
            clock[0] += 0.01
            stop.poll()
    finally:
        stop.close()
    assert stop.interval == 10 and rule[-1][1:] == (0.1, 1, cadence.STOP_MAX_STEPS)
    rule.clear()

    mon = Monitor(None, console=False, device_sampler=None)
    for _ in range(cadence.MONITOR_EVERY):
        mon.step(samples=1)
    mon.close()
    assert rule and rule[0][1:] == (cadence.MONITOR_PERIOD_S, cadence.MONITOR_EVERY,
                                    cadence.MONITOR_SPREAD * cadence.MONITOR_EVERY)
