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

from typing import Any

from scaletrain.errors import StrategyError
from scaletrain.parallel import optim
from scaletrain.parallel.precision import PrecisionSpec, fsdp_mp_policy


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


def build_mesh(env: Any, dims: Any) -> Any:
    """The DeviceMesh: 1-D over all ranks, or 2-D ``(replicate, shard)`` for HSDP."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    device_type = torch.device(env.device).type
    shape = dims.mesh_shape
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def apply(model: Any, optimizer: Any, env: Any, spec: Any, dims: Any, options: Any,
          precision: PrecisionSpec) -> tuple[Any, Any]:
    """``fully_shard`` the model per ``spec``/``dims`` and rebuild the optimizer over its shards."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    if not dist.is_initialized():
        raise StrategyError(
            f"strategy {spec.name!r} needs a process group, and none is initialised",
            hint="start the script with `scaletrain run` (even for 1 process) or call "
                 "scaletrain.init() first")
    mesh = build_mesh(env, dims)
    if spec.offload:
        # Pinned host memory speeds up copies to a GPU; without an accelerator it cannot exist.
        offload: Any = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    else:
        offload = OffloadPolicy()
    kwargs = {"mesh": mesh, "reshard_after_forward": spec.reshard_after_forward,
              "offload_policy": offload}

    names = optim.param_names(model)
    groups = optim.hyper_groups(optimizer, names) if optimizer is not None else []
    for module in wrap_targets(model, min_params=options.min_params, wrap=options.wrap):
        fully_shard(module, mp_policy=fsdp_mp_policy(precision), **kwargs)
    fully_shard(model, mp_policy=fsdp_mp_policy(precision, root=True), **kwargs)
    if optimizer is None:
        return model, None
    new_params = dict(model.named_parameters(remove_duplicate=False))
    return model, optim.rebuild(optimizer, groups, new_params)
