"""The ``zero1`` strategy: DDP for gradients + ZeroRedundancyOptimizer for optimizer state.

Each rank keeps the optimizer state of about 1/world of the parameters and, after its
step, broadcasts its updated parameters; the numbers equal plain DDP's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scaletrain.errors import StrategyError
from scaletrain.parallel import ddp, optim
from scaletrain.parallel.strategy import Context, Sharding

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

    from scaletrain.parallel.strategy import TrainModel


class Zero1Strategy:
    """``zero1``: DDP for gradients; optimizer state partitioned over the ranks."""

    def apply(self, model: nn.Module, optimizer: Optimizer | None,
              ctx: Context) -> tuple[TrainModel, Optimizer | None]:
        """DDP-wrap ``model`` and rebuild ``optimizer`` as a ZeroRedundancyOptimizer of its class."""
        from torch.distributed.optim import ZeroRedundancyOptimizer

        if optimizer is None:
            raise StrategyError("zero1 shards the optimizer, but no optimizer was given",
                                hint="setup(model, optimizer, strategy='zero1'), or use ddp")
        names = optim.param_names(model)
        groups = optim.hyper_groups(optimizer, names)
        wrapped = ddp.wrap(model, ctx.env.device, ctx.options)
        # DDP keeps the module's own parameters, so names map onto the same tensors.
        new_params = dict(wrapped.module.named_parameters(remove_duplicate=False))
        cls = type(optimizer)

        def factory(param_groups: list[dict[str, Any]], **defaults: Any) -> Any:
            return ZeroRedundancyOptimizer(param_groups, optimizer_class=cls, **defaults)

        return wrapped, optim.rebuild(optimizer, groups, new_params, factory=factory)

    def sharding(self, model: TrainModel, ctx: Context) -> Sharding:
        return Sharding(strategy=ctx.spec.name, params="replicated", optimizer="partitioned",
                        dims=ctx.dims, mesh=ctx.mesh, data_rank=ctx.env.rank)
