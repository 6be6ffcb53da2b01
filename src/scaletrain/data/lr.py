"""Learning-rate scaling for a global batch that grows with the number of processes.

With data parallelism every process takes its own batch, so ``batch_size=64`` on 4 processes
is a global batch of 256 per optimizer step: four times the batch the learning rate was tuned
for. The seeds warn that the learning rate (or the batch) must follow the number of replicas;
``scale_lr`` gives the usual rules (Goyal et al. 2017 linear scaling; square-root scaling,
common with Adam), and ``check_global_batch`` warns once when the global batch silently changed.

No torch here: ``scaletrain.scale_lr`` must stay cheap to import.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from scaletrain import module_state, settings
from scaletrain.settings import Spec

RULES = ("linear", "sqrt")


class GlobalBatchWarning(UserWarning):
    """The global batch differs from the one the learning rate was tuned for."""


# (per_process, world_size, base_world_size) combinations already warned about in this process
_warned: set[tuple[int, int, int]] = set()
module_state.register(__name__, "_warned")


# The largest batch (in samples) the checks take: far above any real one, and a bound all the same.
MAX_BATCH = 10 ** 12
# scale_lr's and check_global_batch's settings, declared in the settings vocabulary: one check and
# one message style, "scale_lr(): base_lr must be a finite number above 0, got nan"
OPTIONS: dict[str, Spec] = {
    "base_lr": Spec(doc="pass the learning rate tuned for base_batch, e.g. base_lr=0.1",
                    check=settings.number(above=0)),
    "base_batch": Spec(doc="pass the global batch base_lr was tuned for, in samples, e.g. base_batch=256",
                       check=settings.count(high=MAX_BATCH)),
    "global_batch": Spec(doc="pass the global batch now, in samples, e.g. global_batch=1024",
                         check=settings.count(high=MAX_BATCH)),
    "rule": Spec(doc="use rule='linear' (SGD) or rule='sqrt' (Adam-style optimizers)", check=settings.choice(RULES)),
    "base_world_size": Spec(doc="the number of processes the training was tuned on (None: no check)",
                            check=settings.count(), optional=True),
}


def _checked(owner: str, **values: Any) -> None:
    for name, value in values.items():
        settings.check_value(OPTIONS[name], value, f"{owner}: {name}")


def scale_lr(base_lr: float, base_batch: int, global_batch: int, rule: str = "linear") -> float:
    """The learning rate for ``global_batch`` given one tuned for ``base_batch``.

    ``rule="linear"``: ``base_lr * global_batch / base_batch`` (SGD; pair it with a warm-up).
    ``rule="sqrt"``: ``base_lr * sqrt(global_batch / base_batch)`` (often better for Adam).

    Example: ``scale_lr(0.1, 256, 1024)`` is 0.4; with ``rule="sqrt"`` it is 0.2.
    Raises ``UsageError`` for a non-positive or non-finite rate, non-positive batches or an
    unknown rule.
    """
    _checked("scale_lr()", base_lr=base_lr, base_batch=base_batch, global_batch=global_batch, rule=rule)
    ratio = global_batch / base_batch
    return float(base_lr) * (ratio if rule == "linear" else math.sqrt(ratio))


def global_batch_message(per_process: int, world_size: int, base_world_size: int) -> str:
    """The warning text for a global batch that changed with the number of processes."""
    now, then = per_process * world_size, per_process * base_world_size
    return (f"global batch is {now} = {per_process} x {world_size} processes; it was "
            f"{then} = {per_process} x {base_world_size} when base_world_size={base_world_size}. "
            f"Scale the learning rate (lr = scaletrain.scale_lr(lr, {then}, {now})) or pass "
            f"global_batch_size={then} to keep the global batch; base_world_size=None silences this.")


def check_global_batch(per_process: int, world_size: int, *, base_world_size: int | None = 1,
                       is_main: bool = True) -> str | None:
    """Warn once (``GlobalBatchWarning``) when ``per_process * world_size`` is not the global
    batch the training was tuned with, ``per_process * base_world_size``.

    The trigger: a per-process ``batch_size`` and a world size other than ``base_world_size``
    (default 1: a script tuned on one process, the seeds' starting point). Passing
    ``global_batch_size=`` to ``scaletrain.loader`` never triggers it, because the global batch
    then stays fixed by construction. ``base_world_size=None`` turns the check off. Only the main
    process warns, and each combination once per process. Returns the message, or ``None`` when
    there is nothing to say.
    """
    if base_world_size is None or world_size == base_world_size:
        return None
    _checked("loader()", base_world_size=base_world_size)   # the door it is given by
    message = global_batch_message(per_process, world_size, base_world_size)
    key = (per_process, world_size, base_world_size)
    if is_main and key not in _warned:
        _warned.add(key)
        warnings.warn(message, GlobalBatchWarning, stacklevel=3)
    return message
