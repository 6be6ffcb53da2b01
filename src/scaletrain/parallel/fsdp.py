"""FSDP2 strategies: ``zero2``, ``zero3`` (``fsdp``), ``hsdp`` and ``offload``.

All four are ``torch.distributed.fsdp.fully_shard`` applied bottom-up: first to each sizeable
child module (so that only one block's parameters are gathered at a time), then to the root.
They differ only in the fields of their StrategySpec:

- ``zero2``: ``reshard_after_forward=False`` - parameters stay gathered from forward to
  backward; gradients and optimizer state are sharded.
- ``zero3``: ``reshard_after_forward=True`` - parameters are sharded outside forward/backward.
- ``hsdp``: a 2-D DeviceMesh ``(replicate, shard)``: shard inside a node, replicate across.
- ``offload``: ``CPUOffloadPolicy``: sharded parameters, gradients and optimizer state in host
  memory; the optimizer steps on the CPU.

The optimizer is rebuilt over the sharded (DTensor) parameters with the user's class and
hyper-parameters, so each rank's optimizer state covers only its shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scaletrain.errors import StrategyError
from scaletrain.parallel import optim
from scaletrain.parallel.fsdp_mean import ensure_mean
from scaletrain.parallel.options import PrecisionSpec, StrategyOptions, StrategySpec
from scaletrain.parallel.precision import fsdp_mp_policy
from scaletrain.torch_features import fsdp_on_cpu
from scaletrain.parallel.strategy import Context, Sharding

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

    from scaletrain.parallel.strategy import TrainModel


def wrap_targets(model: Any, *, min_params: int, wrap: tuple[type, ...] | None) -> list[Any]:
    """Child modules that get their own ``fully_shard``, deepest first (root excluded).

    With ``wrap`` every module of those classes; otherwise, post-order, a module whose
    parameters not already covered by a wrapped descendant number at least ``min_params``.
    """
    targets: list[Any] = []
    if wrap:
        for module in model.modules():
            if module is not model and isinstance(module, wrap):
                targets.append(module)
        # fully_shard must go bottom-up: a nested target before the one containing it.
        depth = {id(m): name.count(".") for name, m in model.named_modules()}
        return sorted(targets, key=lambda m: -depth[id(m)])
    seen: set[int] = set()

    def visit(module: Any) -> int:
        remaining = 0
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                remaining += p.numel()
        for child in module.children():
            remaining += visit(child)
        if module is not model and min_params > 0 and remaining >= min_params:
            targets.append(module)
            return 0
        return remaining

    visit(model)
    return targets


def shard(model: Any, mesh: Any, *, spec: StrategySpec, options: StrategyOptions,
          precision: PrecisionSpec) -> Any:
    """``fully_shard`` the wrap targets bottom-up, then the root, over ``mesh``.

    ``mesh`` is 1-D (shard) or 2-D (replicate, shard: HSDP), as ``fully_shard`` reads it.
    """
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    if getattr(mesh, "device_type", None) == "cpu" and not fsdp_on_cpu():
        raise StrategyError(
            f"strategy {spec.name!r} on the CPU needs torch 2.7 or newer (FSDP2 on the CPU; "
            f"this is torch {torch.__version__})",
            hint="torch 2.6 runs it on GPUs; on the CPU use ddp or zero1, or a newer torch")
    if spec.offload:
        # Pinned host memory speeds up copies to a GPU; without an accelerator it cannot exist.
        offload: Any = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    else:
        offload = OffloadPolicy()
    kwargs = {"mesh": mesh, "reshard_after_forward": spec.reshard_after_forward,
              "offload_policy": offload}
    for module in wrap_targets(model, min_params=options.min_params, wrap=options.wrap):
        fully_shard(module, mp_policy=fsdp_mp_policy(precision), **kwargs)
    fully_shard(model, mp_policy=fsdp_mp_policy(precision, root=True), **kwargs)
    # torch 2.7/2.8 over gloo sum where they should average: measured, then corrected or refused
    ensure_mean(model, mesh, {"mp_policy": fsdp_mp_policy(precision), "offload_policy": offload},
                strategy=spec.name)
    return model


class FSDPStrategy:
    """``zero2``/``zero3``/``hsdp``/``offload``: FSDP2 over the mesh's data dimensions."""

    def apply(self, model: nn.Module, optimizer: Optimizer | None,
              ctx: Context) -> tuple[TrainModel, Optimizer | None]:
        """Shard the model per ``ctx.spec`` and rebuild the optimizer over its shards."""
        if ctx.mesh is None:
            raise StrategyError(
                f"strategy {ctx.spec.name!r} needs a process group, and none is initialised",
                hint="start the script with `scaletrain run` (even for 1 process) or call "
                     "scaletrain.init() first")
        names = optim.param_names(model)
        groups = optim.hyper_groups(optimizer, names) if optimizer is not None else []
        shard(model, ctx.mesh, spec=ctx.spec, options=ctx.options, precision=ctx.precision)
        if optimizer is None:
            return model, None
        new_params = dict(model.named_parameters(remove_duplicate=False))
        return model, optim.rebuild(optimizer, groups, new_params)

    def sharding(self, model: TrainModel, ctx: Context) -> Sharding:
        return Sharding(strategy=ctx.spec.name, params="sharded", optimizer="sharded",
                        dims=ctx.dims, mesh=ctx.mesh, data_rank=ctx.env.rank)
