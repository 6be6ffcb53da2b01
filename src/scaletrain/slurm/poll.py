"""The one loop that waits on a job's state: ``submit --wait``, ``Job.wait()``, ``cancel --save``
and ``logs --follow`` all poll through :func:`poll_until`.

What the loop owns, so that no caller gets it wrong again:

- the bound: ``timeout`` is checked (a number, finite, not negative) before anything runs;
- the pace: polling starts every ``poll`` seconds and slows by 20 % a round up to ``max_poll``
  (sites ask users not to hammer slurmctld, and a long job needs no second-by-second check);
- Slurm not answering is not an answer: a failed query (``SlurmError``) is retried, said once
  through ``on_note``, and only ``patience`` failures in a row end the wait, with Slurm's own
  last line. A job's state is never guessed from silence.
- the end: the wait ends within ``timeout`` whatever the queries do. A ``bounded`` fetch is given
  the seconds left and keeps its Slurm calls within them (a stuck ``squeue`` must not turn a 10 s
  wait into 30 s); no sleep runs past the limit; and :class:`Waited` says which limit ended the
  wait (``ended_by``). Time running out after Slurm answered is the caller's timeout, with the last
  state seen - not "Slurm did not answer", which is said only when Slurm never answered in time
  or failed ``patience`` times in a row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from scaletrain import settings
from scaletrain.errors import SlurmError
from scaletrain.settings import Spec

T = TypeVar("T")

PATIENCE = 5        # consecutive unanswered queries before a wait gives up


# A wait's seconds, declared in the settings vocabulary (scaletrain.settings): one check and one
# message style for poll_until's parameters and the Python API's that feed them (Job.wait, cancel).
SECONDS: dict[str, Spec] = {
    "timeout": Spec(doc="the longest wait; None waits until the job ends, e.g. timeout=3600",
                    check=settings.number(low=0), unit="seconds", optional=True),
    "poll": Spec(doc="the pause between two looks at the job, e.g. poll=5", check=settings.number(above=0),
                 unit="seconds"),
    "max_poll": Spec(doc="the longest pause between two looks (the pace slows to it), e.g. max_poll=60",
                     check=settings.number(above=0), unit="seconds", optional=True),
}


def seconds(name: str, value: object) -> float | None:
    """``value`` checked by the declared setting ``name`` of :data:`SECONDS` (SettingError naming it)."""
    checked: float | None = settings.check_value(SECONDS[name], value, name)
    return checked


@dataclass(frozen=True, kw_only=True)
class Waited(Generic[T]):
    """How a wait ended: the last value seen, whether it was final, and the seconds it took."""

    value: T
    done: bool
    seconds: float
    ended_by: str = "done"   # "done", or "timeout": the caller's limit (the job may well go on)


def poll_until(fetch: Callable[..., T], done: Callable[[T], bool], *, timeout: float | None,
               poll: float, max_poll: float | None = None, patience: int = PATIENCE,
               on_change: Callable[[T], None] | None = None, on_note: Callable[[str], None] | None = None,
               bounded: bool = False, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Waited[T]:
    """Call ``fetch`` until ``done(value)`` or ``timeout`` seconds (None: no limit) have passed.

    Returns :class:`Waited` (``done`` False, ``ended_by="timeout"`` when time ran out after an
    answer: the caller words that). ``bounded``: ``fetch`` takes one argument, the seconds left
    (None: no limit), and keeps within them. A fetch that raises ``SlurmError`` is retried;
    ``patience`` failures in a row, or time running out before any answer, raise ``SlurmError``
    saying how long Slurm was silent and which limit ended the wait.
    """
    limit = seconds("timeout", timeout)
    delay = seconds("poll", poll) or 1.0
    ceiling = max(delay, seconds("max_poll", max_poll) or delay)
    start = clock()
    last: list[T] = []
    failures = 0

    def left() -> float | None:
        return None if limit is None else max(0.0, limit - (clock() - start))

    while True:
        try:
            value = fetch(left()) if bounded else fetch()
        except SlurmError as exc:
            failures += 1
            waited = clock() - start
            out_of_time = limit is not None and waited >= limit
            if out_of_time and last:   # Slurm answered before: the caller's limit ended the wait
                return Waited(value=last[0], done=False, seconds=waited, ended_by="timeout")
            if failures >= patience or out_of_time:
                which = (f"within the {limit:g} s limit (timeout={limit:g})" if out_of_time and failures < patience
                         else f"{failures} time{'s' * (failures > 1)} in a row over {waited:.0f} s")
                raise SlurmError(f"Slurm did not answer {which}: {exc.message}",
                                 "the job itself may be fine: check 'squeue' or 'sinfo', then wait again") from None
            if on_note is not None and failures == 1:
                on_note(f"Slurm did not answer ({exc.message}); still waiting, retrying up to "
                        f"{patience - 1} more times")
            remaining = left()
            sleep(delay if remaining is None else min(delay, remaining))
            delay = min(ceiling, delay * 1.2)
            continue
        if failures and on_note is not None:
            on_note("Slurm answers again")
        failures = 0
        if on_change is not None and (not last or last[0] != value):
            on_change(value)
        last[:] = [value]
        waited = clock() - start
        if done(value):
            return Waited(value=value, done=True, seconds=waited)
        if limit is not None and waited >= limit:
            return Waited(value=value, done=False, seconds=waited, ended_by="timeout")
        sleep(delay if limit is None else max(0.0, min(delay, limit - waited)))
        delay = min(ceiling, delay * 1.2)
