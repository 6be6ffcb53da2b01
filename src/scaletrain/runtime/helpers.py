"""Small rank-aware helpers: print from one rank, wait for all, let rank 0 go first.

They work in every state a script can be in: after ``scaletrain.init()``, after the script's
own ``init_process_group``, or with no process group at all (a single process: barrier is a
no-op and main_first just runs the block). None of them imports torch unless a process group
already exists, so ``scaletrain.print`` costs nothing in a script that never trains.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from scaletrain import settings
from scaletrain.errors import DistEnvError
from scaletrain.runtime.current import (collective_device, current_placement, group_rank_world,
                                        live_dist, rank_world)


def _ranks(value: Any) -> bool:
    return value == "all" or (isinstance(value, (list, tuple, set, frozenset, range)) and all(
        isinstance(r, int) and not isinstance(r, bool) and 0 <= r < settings.MAX_COUNT for r in value))


# the helpers' arguments, declared in the settings vocabulary
RANKS = settings.Spec(doc="e.g. ranks=[0, 1], or ranks='all'",
                      check=settings.kind(_ranks, "'all' or a list of whole numbers from 0"))
LOCAL = settings.Spec(doc="True: local rank 0 of each node goes first", check=settings.boolean())


def rank_print(*args: Any, ranks: Iterable[int] | Literal["all"] = (0,), **kwargs: Any) -> None:
    """``print`` on the chosen ranks only: rank 0 by default (also ``scaletrain.print``).

    ``ranks="all"`` prints everywhere with a ``[rank N]`` prefix (also added whenever several
    ranks are chosen in a multi-process job, so lines can be told apart). Other keyword
    arguments go to the builtin ``print``; output is flushed so ranks do not interleave
    half lines.
    """
    settings.check_value(RANKS, ranks, "rank_print(): ranks")
    rank, world = rank_world()
    if ranks == "all":
        chosen = True
        prefix = world > 1
    else:
        wanted = set(ranks)
        chosen = rank in wanted
        prefix = world > 1 and len(wanted) > 1
    if not chosen:
        return
    kwargs.setdefault("flush", True)
    if prefix:
        builtins.print(f"[rank {rank}]", *args, **kwargs)
    else:
        builtins.print(*args, **kwargs)


# The name users know; ``rank_print`` is the same function without shadowing the builtin
# (``from scaletrain import *`` exports only ``rank_print``).
print = rank_print


def barrier() -> None:
    """Wait until every rank gets here. A no-op for a single process.

    Raises :class:`DistEnvError` in a multi-process job without a process group: a barrier
    that cannot wait for anyone would silently let ranks race.
    """
    dist = live_dist()
    if dist is not None:
        if group_rank_world()[1] > 1:
            device = collective_device()
            if device.startswith("cuda:"):
                # name the GPU: NCCL would otherwise guess it from the rank
                dist.barrier(device_ids=[int(device.split(":", 1)[1])])
            else:
                dist.barrier()
        return
    _, world = rank_world()
    if world > 1:
        raise DistEnvError(f"barrier() in a job of {world} processes without a process group",
                           "call scaletrain.init() first")


@contextmanager
def main_first(*, local: bool = False) -> Iterator[None]:
    """Rank 0 runs the block first; the others wait, then run it themselves.

    For work whose result the others reuse, such as a dataset download into a shared cache::

        with scaletrain.main_first():
            data = torchvision.datasets.CIFAR10(root, download=True)

    ``local=True`` lets the first rank of each node go first (node-local scratch). If the
    first rank's block raises, the others are still released (and will likely fail the same
    way) instead of hanging in the barrier.
    """
    settings.check_value(LOCAL, local, "main_first(): local")
    place = current_placement()
    first = place.is_local_main if local else place.is_main
    if not first:
        barrier()
        yield
        return
    try:
        yield
    finally:
        barrier()
