"""The ``zero1`` strategy: DDP for gradients + ZeroRedundancyOptimizer for optimizer state.

Each rank keeps the optimizer state of about 1/world of the parameters and, after its
step, broadcasts its updated parameters; the numbers equal plain DDP's.
"""

from __future__ import annotations

from typing import Any

from scaletrain.parallel import ddp, optim


def apply(model: Any, optimizer: Any, env: Any, options: Any) -> tuple[Any, Any]:
    """DDP-wrap ``model`` and rebuild ``optimizer`` as a ZeroRedundancyOptimizer of its class."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    names = optim.param_names(model)
    groups = optim.hyper_groups(optimizer, names) if optimizer is not None else []
    wrapped = ddp.apply(model, env, options)
    if optimizer is None:
        return wrapped, None
    # DDP keeps the module's own parameters, so names map onto the same tensors.
    new_params = dict(wrapped.module.named_parameters(remove_duplicate=False))
    cls = type(optimizer)

    def factory(param_groups: list[dict[str, Any]], **defaults: Any) -> Any:
        return ZeroRedundancyOptimizer(param_groups, optimizer_class=cls, **defaults)

    return wrapped, optim.rebuild(optimizer, groups, new_params, factory=factory)
