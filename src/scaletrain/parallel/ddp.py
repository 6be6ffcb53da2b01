"""The ``ddp`` strategy: torch's DistributedDataParallel, with an actionable unused-parameter error."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scaletrain.errors import StrategyError
from scaletrain.parallel.options import StrategyOptions
from scaletrain.parallel.strategy import Context, Sharding

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

    from scaletrain.parallel.strategy import TrainModel

_UNUSED_MARKERS = ("Expected to have finished reduction in the prior iteration",
                   "did not receive grad", "find_unused_parameters")


def _ddp_class() -> type:
    from torch.nn.parallel import DistributedDataParallel

    class ScaletrainDDP(DistributedDataParallel):
        """DistributedDataParallel whose unused-parameter error says how to fix it.

        DDP raises that error at the *next* forward, as a RuntimeError with a page of text;
        we re-raise it as a StrategyError with the hint (the original stays chained).
        """

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().forward(*args, **kwargs)
            except RuntimeError as err:
                if any(marker in str(err) for marker in _UNUSED_MARKERS) and \
                        not self.find_unused_parameters:
                    raise StrategyError(
                        "DDP: some parameters got no gradient in the previous step, so their "
                        "all-reduce never finished",
                        hint="setup(..., find_unused_parameters=True), or make every parameter "
                             "take part in the loss") from err
                raise

    return ScaletrainDDP


def wrap(model: Any, device: str, options: StrategyOptions, *,
         process_group: Any = None) -> Any:
    """``model`` (already on ``device``) in DistributedDataParallel over ``process_group``.

    ``process_group`` None means every rank (the default group).
    """
    import torch

    dev = torch.device(device)
    kwargs: dict[str, Any] = {
        "static_graph": options.static_graph,
        "find_unused_parameters": options.find_unused_parameters,
        "process_group": process_group,
    }
    if options.bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = options.bucket_cap_mb
    if dev.type in ("cuda", "xpu"):
        # One device per process: DDP wants that device named; on CPU it must get none.
        kwargs["device_ids"] = [dev.index if dev.index is not None else 0]
    return _ddp_class()(model, **kwargs)


class DDPStrategy:
    """``ddp``: a full replica per rank, gradients all-reduced over the ``replicate`` ranks."""

    def apply(self, model: nn.Module, optimizer: Optimizer | None,
              ctx: Context) -> tuple[TrainModel, Optimizer | None]:
        return wrap(model, ctx.env.device, ctx.options), optimizer

    def sharding(self, model: TrainModel, ctx: Context) -> Sharding:
        return Sharding(strategy=ctx.spec.name, params="replicated", optimizer="replicated",
                        dims=ctx.dims, mesh=ctx.mesh, data_rank=ctx.env.rank)
