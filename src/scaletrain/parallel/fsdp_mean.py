"""Does FSDP2 average the gradients over this mesh? Asked of torch once per ``setup()``.

FSDP2 hands the gradient reduction to the process group with ``ReduceOp.AVG`` for fp32 and
bf16 gradients on torch 2.7.1 and 2.8.0 (``_fsdp_collectives.foreach_reduce``). NCCL averages;
gloo (the CPU) does not: its ``reduce_scatter_tensor`` takes ``AVG`` and silently *sums*, and
its ``all_reduce`` refuses it ("Cannot use ReduceOp.AVG with Gloo"). So zero2/zero3/offload on
the CPU trained with gradients ``world`` times too large, and hsdp stopped with a traceback.
torch 2.9.1 reduces with a sum and divides itself where the backend lacks ``AVG``.

A release number cannot say which of these a centre's build does, so :func:`ensure_mean`
measures it: a one-parameter module is sharded over the same mesh with the same policies,
each rank feeds it a different input, and the reduced gradient is compared with the mean
over ranks. Where torch summed, an FSDP all-reduce hook (``set_all_reduce_hook``, run on the
reduced shard) divides by the group's size, and a second probe with that hook must give the
mean; where it cannot be made right, the strategy stops with one line naming the torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from scaletrain.errors import StrategyError

# Relative error of the probe's gradient that still counts as the mean: its values are small
# integers and halves, exact in fp32 and bf16; the bar only absorbs fp16 pre/post-division.
_TOLERANCE = 1e-3


def _divide(factor: float, reduced: Any) -> None:
    """The all-reduce hook: turn the summed shard of gradients into their mean, in place."""
    reduced.div_(factor)


def _corrections(ratio: float | None) -> list[tuple[str, Callable[[Any], None]]]:
    """What can turn FSDP2's reduction into the mean, preferred first, as (name, apply to one
    FSDP module): torch's own switch to sum-then-divide (``set_force_sum_reduction_for_comms``,
    from 2.8.0: it also keeps hsdp's all-reduce off ``AVG``), else, where the probe measured a
    whole multiple of the mean, a hook that divides the reduced shard by it (2.7.1)."""
    fixes: list[tuple[str, Callable[[Any], None]]] = [
        ("set_force_sum_reduction_for_comms",
         lambda m: m.set_force_sum_reduction_for_comms(True))]
    if ratio is not None and ratio > 1.5 and abs(ratio - round(ratio)) <= _TOLERANCE * ratio:
        factor = float(round(ratio))
        fixes.append(("set_all_reduce_hook",
                      lambda m: m.set_all_reduce_hook(functools.partial(_divide, factor))))
    return fixes


def _probe_ratio(mesh: Any, fsdp_kwargs: dict[str, Any],
                 fix: Callable[[Any], None] | None) -> tuple[float | None, str]:
    """The probe's reduced gradient divided by the true mean over ``mesh``'s ranks (1.0: torch
    averages), with ``fix`` applied to the probe first; ``(None, first line of the error)``
    where torch's reduction raised (gloo: "Cannot use ReduceOp.AVG with Gloo", which every
    rank raises alike, before any data moves)."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    class Probe(nn.Module):
        def __init__(self, numel: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(numel))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.weight * x).sum()  # d/d weight = x: this rank's input

    n = mesh.size()
    probe = Probe(2 * n)  # 2 elements per rank: every rank holds a shard of it
    fully_shard(probe, mesh=mesh, **fsdp_kwargs)
    if fix is not None:
        fix(probe)
    # the rank's place in the mesh, 0..n-1, flattened: inputs 1..n, whose mean is (n + 1) / 2
    place = 0
    for coordinate, size in zip(mesh.get_coordinate() or [0], mesh.mesh.shape):
        place = place * int(size) + int(coordinate)
    weight: Any = probe.weight  # a DTensor now (typed as the Parameter it replaced)
    device = weight.to_local().device
    try:
        with torch.enable_grad():
            probe(torch.full((2 * n,), float(place + 1), device=device)).backward()
    except RuntimeError as err:
        return None, (str(err).strip().splitlines() or [type(err).__name__])[0]
    grad: Any = probe.weight.grad  # the reduced shard, a DTensor
    got = grad.full_tensor().float()
    return float(got.mean()) / ((n + 1) / 2), ""


def _is_mean(ratio: float | None) -> bool:
    return ratio is not None and abs(ratio - 1) <= _TOLERANCE


def ensure_mean(model: Any, mesh: Any, fsdp_kwargs: dict[str, Any], *, strategy: str) -> None:
    """Make ``model``'s (already ``fully_shard``-ed) gradients the mean over ``mesh``, or stop.

    A collective over ``mesh``: every rank of it calls this at the same point of ``setup()``
    (the probe's answer is the same on every rank, so all take the same branch).
    ``fsdp_kwargs`` are the ``fully_shard`` arguments other than ``mesh`` (policies).

    Raises:
        StrategyError: this torch and backend cannot average FSDP2's gradients (one line,
            naming the torch; the hint names strategies that can).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    if mesh.size() < 2:
        return
    ratio, error = _probe_ratio(mesh, fsdp_kwargs, None)
    if _is_mean(ratio):
        return
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for name, fix in _corrections(ratio):
        if all(callable(getattr(m, name, None)) for m in modules) \
                and _is_mean(_probe_ratio(mesh, fsdp_kwargs, fix)[0]):
            for module in modules:
                fix(module)
            return
    backend = dist.get_backend(mesh.get_group(0))
    found = (f"stops in its reduction ({error})" if ratio is None
             else f"reduces the gradients to {ratio:.4g} times their mean")
    raise StrategyError(
        f"strategy {strategy!r} over {backend} on torch {torch.__version__}: FSDP2 {found} over "
        f"{mesh.size()} ranks, and this torch has no way to correct it",
        hint="use ddp or zero1 here (they average over any backend), NCCL on GPUs, "
             "or torch 2.8 or newer")
