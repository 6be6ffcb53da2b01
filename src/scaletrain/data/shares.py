"""Each process's share of the data: its batch, its DataLoader workers and the rank and world
size it shards for, and ``loader()``'s options in the settings vocabulary.

``scaletrain.data.loader`` builds the loader from these; they are apart because each is a rule a
user asks about on its own ("how is global_batch_size split?", "how many workers does 'auto'
give?") and the batch rule is shared with the learning-rate scaling (``scaletrain.data.lr``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from scaletrain import settings
from scaletrain.data.lr import MAX_BATCH
from scaletrain.errors import UsageError
from scaletrain.runtime.current import GROUP, current_env
from scaletrain.runtime.env import ENV, Env

AUTO_WORKERS_CAP = 8  # past ~8 workers per process, input pipelines rarely get faster


def _workers(value: Any) -> Any:
    """``"auto"`` or a whole number of worker processes from 0."""
    if isinstance(value, str) and value == "auto":
        return value
    try:
        return settings.count(low=0)(value)
    except settings.Bad:
        raise settings.Bad(f"'auto' or a whole number from 0 to {settings.MAX_COUNT:,}") from None


# loader()'s settings, declared in the settings vocabulary (scaletrain.settings): one check and
# one message style, "loader(): seed must be a whole number from 0 to ..., got -1"
OPTIONS: dict[str, settings.Spec] = {
    "batch_size": settings.Spec(doc="samples per process per step, e.g. batch_size=64",
                                check=settings.count(high=MAX_BATCH)),
    "global_batch_size": settings.Spec(doc="samples per optimizer step over all processes, e.g. "
                                           "global_batch_size=256", check=settings.count(high=MAX_BATCH)),
    # torch.Generator.manual_seed takes up to 2**64 - 1
    "seed": settings.Spec(doc="use the same seed on every rank, e.g. seed=0",
                          check=settings.count(low=0, high=2**64 - 1)),
    "num_workers": settings.Spec(doc="num_workers='auto' uses the CPUs given to this process", check=_workers),
    "epoch": settings.Spec(doc="e.g. loader.epoch = 3 starts the next pass at epoch 3",
                           check=settings.count(low=0, high=10**12)),
    "rank": settings.Spec(doc="the rank to shard for; leave it out for the job's", optional=True,
                          check=settings.count(low=0, high=settings.MAX_COUNT - 1)),
    "world_size": settings.Spec(doc="the processes to shard over; leave it out for the job's", optional=True,
                                check=settings.count()),
    "base_world_size": settings.Spec(doc="the world size batch_size was tuned on (None: no check)",
                                     optional=True, check=settings.count()),
    "eval": settings.Spec(doc="True: every sample once, in order, nothing dropped", check=settings.boolean()),
    "collate_fn": settings.Spec(doc="a function that makes a batch of a list of samples", optional=True,
                                check=settings.kind(callable, "a function (callable)")),
    "env": ENV,
    "group": GROUP,
    # None: the loader's choice (shuffle and drop_last for training; pinning on a GPU; ...)
    **{name: settings.Spec(doc=doc, check=settings.boolean(), optional=True) for name, doc in (
        ("shuffle", "a new order every epoch (default for training)"),
        ("drop_last", "drop the short last batch (default for training)"),
        ("pin_memory", "page-locked batches for a faster copy to the GPU"),
        ("persistent_workers", "keep the worker processes between epochs"))},
}


def check_option(name: str, value: Any, owner: str = "loader()") -> Any:
    """``value`` of ``loader()``'s option ``name`` checked by its setting; its error names ``owner``."""
    return settings.check_value(OPTIONS[name], value, f"{owner}: {name}")


def per_process_batch(batch_size: int | None, global_batch_size: int | None,
                      world_size: int) -> int:
    """The per-process batch from exactly one of ``batch_size`` (per process) and
    ``global_batch_size`` (divided by ``world_size``). ``UsageError`` otherwise, naming the
    nearest valid global sizes when the global one does not divide."""
    if (batch_size is None) == (global_batch_size is None):
        raise UsageError("pass exactly one of batch_size= (per process) and global_batch_size=",
                         hint="global_batch_size=256 keeps the optimizer's batch fixed at any "
                              "world size; batch_size=64 is per process (global = 64 x processes)")
    if batch_size is not None:
        checked: int = check_option("batch_size", batch_size)
        return checked
    check_option("global_batch_size", global_batch_size)
    assert global_batch_size is not None  # narrowed above; not user input
    if global_batch_size % world_size == 0:
        return global_batch_size // world_size
    below = global_batch_size // world_size * world_size
    above = below + world_size
    options = [f"{g} ({g // world_size} per process)" for g in (below, above) if g > 0]
    raise UsageError(
        f"global_batch_size={global_batch_size} is not divisible by {world_size} processes",
        hint=f"use global_batch_size={' or '.join(options)}, or pass batch_size= per process")


def auto_num_workers(env: Env, cap: int = AUTO_WORKERS_CAP) -> int:
    """DataLoader workers for this process: the CPUs it may run on, minus one for the main
    process, at most ``cap``; 0 on a one-core share.

    The CPU set is ``os.sched_getaffinity(0)`` (what Slurm's ``--cpus-per-task`` binding or
    ``taskset`` gives). When it is the whole machine yet several ranks share the node (no
    binding), each rank counts only its ``1/local_world_size`` share, so N ranks do not each
    start a machine's worth of workers.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    if cpus >= (os.cpu_count() or cpus) and env.local_world_size > 1:
        cpus = max(1, cpus // env.local_world_size)
    return max(0, min(cap, cpus - 1))


def resolve_env(env: Env | None = None, *, rank: int | None = None,
                world_size: int | None = None) -> Env:
    """The rank and world size to shard for: ``env`` if given; else the Env of
    ``scaletrain.init()``; else a live torch.distributed process group; else
    ``scaletrain.detect()``; else a single process. ``rank=``/``world_size=`` override."""
    if env is None:
        env = current_env()
    if rank is not None or world_size is not None:
        env = dataclasses.replace(env, rank=env.rank if rank is None else rank,
                                  world_size=env.world_size if world_size is None else world_size)
    if env.world_size < 1 or not 0 <= env.rank < env.world_size:
        raise UsageError(f"rank {env.rank} is not in a world of {env.world_size} processes",
                         hint="pass 0 <= rank < world_size, or let scaletrain.init() detect them")
    return env
