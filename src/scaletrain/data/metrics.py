"""Metric reductions across ranks: means of losses and accuracies, gathering small results.

Both helpers are identities in a single process, so the same evaluation code runs on 1 or N
processes. They are collectives when a process group exists: every rank must call them, the
same number of times, in the same order — call them after the evaluation loop, not per batch
(evaluation shards may give ranks different numbers of batches; see ``scaletrain.loader``).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
import torch.distributed as dist

from scaletrain import settings
from scaletrain.runtime import collectives
from scaletrain.runtime.current import GROUP, collective_device, group_rank_world


def _value(value: Any) -> bool:
    """A tensor, or a real number a float can hold (NaN and inf pass: a diverged loss is
    averaged as it is; 10**400 is no float)."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


# the reductions' arguments, in the settings vocabulary
VALUE = settings.Spec(doc="reduce a loss as loss.detach() or float(loss)",
                      check=settings.kind(_value, "a number or a tensor"))
WEIGHT = settings.Spec(doc="the number of samples this rank evaluated, e.g. weight=len(shard)",
                       check=settings.number(low=0), optional=True)


def _world(group: Any = None) -> int:
    return group_rank_world(group)[1]


def _comm_device(group: Any = None) -> torch.device:
    return torch.device(collective_device(group))


def all_reduce_mean(value: float | int | torch.Tensor, *, weight: float | int | None = None,
                    group: Any = None) -> float | torch.Tensor:
    """Mean of ``value`` over the ranks of ``group`` (default: all ranks).

    ``value`` is a Python number (returns a ``float``) or a tensor (returns a new tensor of the
    same shape, device and floating dtype; the input is not modified; integer tensors come back
    as float64). With ``weight=`` the mean is weighted: ``sum(value_r * weight_r) /
    sum(weight_r)`` — pass the number of samples a rank evaluated, so uneven evaluation shards
    give the exact dataset mean (a rank with no samples passes ``weight=0``). All weights 0
    gives NaN. Without a process group, or with one rank, it returns ``value`` (as a float for
    numbers). It is a collective: every rank must call it.
    """
    settings.check_value(VALUE, value, "all_reduce_mean(): value")
    settings.check_value(WEIGHT, weight, "all_reduce_mean(): weight")
    settings.check_value(GROUP, group, "all_reduce_mean(): group")
    is_tensor = isinstance(value, torch.Tensor)
    if _world(group) == 1:
        return value if is_tensor else float(value)

    device = _comm_device(group)
    if isinstance(value, torch.Tensor):
        out_dtype = value.dtype if value.is_floating_point() else torch.float64
        flat = value.detach().to(device=device, dtype=torch.float64).reshape(-1)
    else:
        out_dtype = torch.float64
        flat = torch.tensor([float(value)], dtype=torch.float64, device=device)
    if weight is None:
        # a plain mean: sum of values, then divide by the number of ranks
        collectives.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        mean = flat / _world(group)
    else:
        # one collective for numerator and denominator together
        w = float(weight)
        packed = torch.cat([flat * w, torch.tensor([w], dtype=torch.float64, device=device)])
        collectives.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
        mean = packed[:-1] / packed[-1]
    if not isinstance(value, torch.Tensor):
        return float(mean.item())
    return mean.reshape(value.shape).to(device=value.device, dtype=out_dtype)


def gather_objects(obj: Any, *, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` (picklable), as a list indexed by rank in ``group``.

    ``[obj]`` without a process group. Meant for small results (per-rank predictions of an
    evaluation shard, counts, timings): objects are pickled and exchanged whole. On NCCL the
    current CUDA device must be this rank's (``scaletrain.init()`` sets it). A collective.
    """
    settings.check_value(GROUP, group, "gather_objects(): group")
    world = _world(group)
    if world == 1:
        return [obj]
    return collectives.all_gather_objects(obj, group=group)
