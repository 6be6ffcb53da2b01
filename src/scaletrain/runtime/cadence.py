"""How often the ranks synchronise while a loop trains: one rule for every per-step exchange.

Two exchanges run between the ranks during training: the stop agreement
(:class:`scaletrain.runtime.agreement.StopAgreement`: every rank stops at the same step) and the
Monitor's window exchange (:class:`scaletrain.Monitor`: stragglers, idle devices). Neither may
run at every step - with sub-millisecond steps its cost would show - and neither can afford a
message to agree on when it runs next. Both follow :func:`sync_interval`: the next exchange
comes a whole number of steps later, about one period at the slowest rank's step time, and
every rank derives that number from the figures the last exchange shared (the same on every
rank), so all ranks meet at the same step.

They stay two collectives: a script may use either without the other (a Monitor without a
Checkpointer, or the reverse), and they move different things (a few integers, reduced
asynchronously on a side stream, against a picklable record gathered on the training thread).
"""

from __future__ import annotations

# The stop agreement: rare enough that its all-reduce is invisible even on a tiny model, often
# enough that a stop is seen within a second or two (a time limit warns minutes ahead).
STOP_PERIOD_S = 0.5
STOP_MAX_STEPS = 10_000
# The Monitor: every MONITOR_EVERY steps, or about a second of steps when that is more (a tiny
# model's exchange costs as much as a hundred of its steps' monitoring), at most MONITOR_SPREAD
# times further apart.
MONITOR_EVERY = 100
MONITOR_PERIOD_S = 1.0
MONITOR_SPREAD = 100


def sync_interval(step_us: float, period_s: float, *, least: int = 1, most: int) -> int:
    """Steps until the next exchange: ``period_s`` worth of steps of ``step_us`` microseconds
    (the slowest rank's mean, as the last exchange shared it), within ``least..most``.

    ``least`` when the step time is not known yet (0) or ``period_s`` is 0 (an exchange every
    ``least`` steps).
    """
    if step_us <= 0 or period_s <= 0:
        return least
    return max(least, min(most, int(period_s * 1e6 // step_us)))


def monitor_interval(slowest_s: float, every: int, *, spaced: bool) -> int:
    """The Monitor's steps until its next exchange, from the slowest rank's window step time.

    ``every`` steps; with ``spaced`` (``every`` left to its default) about
    :data:`MONITOR_PERIOD_S` of steps when that is more, up to ``MONITOR_SPREAD * every``.
    """
    period = MONITOR_PERIOD_S if spaced else 0.0
    return sync_interval(max(slowest_s, 1e-9) * 1e6, period, least=every,
                         most=MONITOR_SPREAD * every)


def stop_interval(step_us: int, period_s: float) -> int:
    """The stop agreement's calls until its next sync, from the reduced (slowest) step time."""
    return sync_interval(step_us, period_s, most=STOP_MAX_STEPS)
