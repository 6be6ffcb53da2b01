"""Collective timeouts: long while a job starts, shorter once training runs.

At start-up ranks legitimately wait for each other for minutes (Slurm starts nodes apart,
the first rank loads data, compiles, downloads). Once the first training step has run,
every rank is in the loop and a collective that waits for minutes means a rank stopped
answering; a shorter timeout then ends the job instead of keeping the allocation idle.
torchtitan does the same (``distributed/utils.py`` ``set_pg_timeouts``) with torch's
``_set_pg_timeout``, which changes the timeout of an existing group in place (gloo and NCCL).

Sources of the step timeout, first wins: ``init(step_timeout_s=...)``, ``SCALETRAIN_TIMEOUT``
(``scaletrain run --timeout S`` sets it for its workers), :data:`DEFAULT_STEP_TIMEOUT_S`,
never more than the start-up timeout. "Training started" is signalled by
:func:`training_started`: the loader calls it when a second batch is asked for, the stop
agreement when it first polls, and a script may call it itself. It is idempotent, local (no
collective) and costs one flag test after the first call. Changing a group's timeout in place
goes through torch's privates, so ``SCALETRAIN_TORCH_AS_IS=1`` leaves every group with the
timeout it was created with.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from datetime import timedelta

from scaletrain import module_state, settings
from scaletrain.contract.environ import TIMEOUT_VAR, torch_as_is
from scaletrain.errors import DistEnvError, UsageError

# Slurm may start the nodes of one job minutes apart; the first collective waits for all.
STARTUP_TIMEOUT_S = 1800.0
# Once every rank is in the training loop (NCCL's own default). Long enough for a blocking
# checkpoint save or an evaluation on one rank while the others wait; raise it if yours are longer.
DEFAULT_STEP_TIMEOUT_S = 600.0

_step_s: float | None = None   # None: init() has not configured a group
_started = False
module_state.register(__name__, "_step_s", "_started", leak=True)


# A collective timeout in the settings vocabulary: init()'s timeout_s and step_timeout_s and
# $SCALETRAIN_TIMEOUT alike. At most a year: no job runs longer (and torch keeps timeouts in
# milliseconds); True is not one second, "600" is not a number, inf never ends.
MAX_TIMEOUT_S = 365 * 86400.0
TIMEOUT = settings.Spec(doc="seconds, e.g. 600 (10 minutes); leave it out for the default",
                        check=settings.number(above=0, high=MAX_TIMEOUT_S), unit="seconds", optional=True)


def check_seconds(value: object, name: str) -> float | None:
    """``value`` (None: not given) checked as a timeout, or SettingError naming ``init(): name``."""
    checked: float | None = settings.check_value(TIMEOUT, value, f"init(): {name}")
    return checked


def _from_text(text: str) -> float:
    """``$SCALETRAIN_TIMEOUT``'s seconds, checked as the API's are; UsageError when it is not one."""
    try:
        value: object = float(text)
    except ValueError:
        value = text
    seconds = settings.check_value(TIMEOUT, value, TIMEOUT_VAR)
    assert seconds is not None   # text is not None
    return float(seconds)


def step_timeout(startup_s: float, step_timeout_s: float | None = None,
                 environ: Mapping[str, str] | None = None) -> float:
    """The collective timeout once training runs (seconds); see the module doc for the order."""
    seconds = check_seconds(step_timeout_s, "step_timeout_s")
    if seconds is not None:
        return seconds
    env = os.environ if environ is None else environ
    text = env.get(TIMEOUT_VAR, "").strip()
    if text:
        try:
            return _from_text(text)
        except UsageError:
            raise DistEnvError(f"{TIMEOUT_VAR}={text!r} is not a positive number of seconds",
                               "unset it, or give scaletrain run --timeout SECONDS") from None
    return min(DEFAULT_STEP_TIMEOUT_S, startup_s)


def configure(step_s: float | None) -> None:
    """Remember the step timeout of the group init() just created (None: forget it)."""
    global _step_s, _started
    _step_s, _started = step_s, False


def current_step_timeout() -> float | None:
    """The step timeout init() configured, or None without init()."""
    return _step_s


def is_started() -> bool:
    """True once :func:`training_started` shortened the timeouts."""
    return _started


def training_started() -> bool:
    """Say that the first training step has run: shorten every collective timeout now.

    Idempotent and cheap (one flag test after the first call); local to this rank (no
    collective), so each rank may call it at its own moment. Returns True on the call that
    changed the timeouts. Without ``scaletrain.init()`` it does nothing.
    """
    global _started
    if _started or _step_s is None:
        return False
    _started = True
    if torch_as_is(os.environ):  # the way out of every change to torch's internals: this too
        return False
    from scaletrain.runtime.current import live_dist

    if live_dist() is None:
        return False
    set_group_timeouts(_step_s)
    return True


def set_group_timeouts(seconds: float) -> None:
    """Set the timeout of the default group and of every group this rank belongs to.

    torch's setter and its list of groups are private (:mod:`scaletrain.torch_features` looks
    them up); where either is gone, the groups keep their start-up timeout, said once.
    """
    from scaletrain.torch_features import pg_timeout_setter, process_groups

    setter, known = pg_timeout_setter(), process_groups()
    if setter is None or known is None:
        print("scaletrain: this torch cannot change a group's timeout in place "
              "(distributed_c10d._set_pg_timeout or _world.pg_map is gone): collectives keep "
              "the start-up timeout", file=sys.stderr, flush=True)
        return
    timeout = timedelta(seconds=seconds)
    for group in [None, *known]:
        try:
            setter(timeout, group)
        except (ValueError, RuntimeError, AssertionError, AttributeError):
            # a group this rank is not in, or a backend without settable timeouts (mpi)
            continue
