"""One interface for every strategy, the one mesh, and what checkpoints need to know.

``setup()`` validates the degrees (:class:`~scaletrain.parallel.options.ParallelDims`),
builds ONE DeviceMesh from them (:func:`build_mesh`) and hands model, optimizer and a
:class:`Context` to the strategy's ``apply``; every strategy has the same shape
(torchtitan's ``parallelize_*`` functions)::

    class Strategy(Protocol):
        def apply(self, model, optimizer, ctx) -> (model, optimizer)
        def sharding(self, model, ctx) -> Sharding

:class:`Sharding` answers a checkpointer's questions: which state is split over ranks, how,
and over which mesh and process groups. After ``setup()`` ask
:func:`describe` (``scaletrain.parallel.describe(model_or_optimizer)``).

Mesh. Dimensions in a fixed order, outermost first, each present only when larger than 1:
``replicate`` (identical copies: DDP replicas, HSDP's outer dimension, pipeline replicas
under DDP), ``shard`` (FSDP2 shards, also pipeline replicas under FSDP), ``pipeline``
(stages, innermost so one pipeline's stages are neighbouring ranks, usually one node).
Rank ``r`` is stage ``r % P`` and data rank ``r // P``. Nothing here imports torch at
import time, nor any strategy: they import this module, and ``setup`` picks one
(:func:`scaletrain.parallel.setup.strategy_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from scaletrain.parallel.options import ParallelDims, StrategyOptions, StrategySpec
from scaletrain.parallel.options import PrecisionSpec
from scaletrain.parallel.precision import state_of
from scaletrain.parallel.sharding import Layout, Sharding

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.optim import Optimizer

    from scaletrain.parallel.pipeline_model import PipelineModel
    from scaletrain.runtime.env import Env

    # what a strategy returns to train with: a module, or one rank's pipeline stage
    TrainModel: TypeAlias = nn.Module | PipelineModel

MESH_DIMS: tuple[str, ...] = ("replicate", "shard", "pipeline")

@dataclass(frozen=True, kw_only=True)
class Context:
    """What every strategy's ``apply`` gets besides the model and the optimizer."""

    env: Env
    spec: StrategySpec
    dims: ParallelDims
    mesh: DeviceMesh | None
    options: StrategyOptions
    precision: PrecisionSpec


class Strategy(Protocol):
    """The shape of every strategy: wrap the model and optimizer, then say what is sharded."""

    def apply(self, model: nn.Module, optimizer: Optimizer | None,
              ctx: Context) -> tuple[TrainModel, Optimizer | None]:
        """The model and optimizer to train with (the optimizer may be None)."""
        ...

    def sharding(self, model: TrainModel, ctx: Context) -> Sharding:
        """How the state of ``model`` (as ``apply`` returned it) is spread over the ranks."""
        ...


def mesh_dims(dims: ParallelDims, *, primary: str = "replicate") -> tuple[tuple[str, ...],
                                                                          tuple[int, ...]]:
    """Names and sizes of the mesh for ``dims``: every dimension > 1, in MESH_DIMS order.

    With all degrees 1 the mesh is 1-D over one rank, named ``primary``.
    """
    sizes = {"replicate": dims.replicate, "shard": dims.shard, "pipeline": dims.pipeline}
    names = tuple(d for d in MESH_DIMS if sizes[d] > 1) or (primary,)
    return names, tuple(sizes[d] for d in names)


def build_mesh(dims: ParallelDims, device_type: str, *, primary: str = "replicate"
               ) -> DeviceMesh:
    """THE DeviceMesh for ``dims`` (see :func:`mesh_dims`); needs a live process group."""
    from torch.distributed.device_mesh import init_device_mesh

    names, shape = mesh_dims(dims, primary=primary)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


class NoneStrategy:
    """``none``: the model as it is (one process, or each rank its own copy)."""

    def apply(self, model: nn.Module, optimizer: Optimizer | None,
              ctx: Context) -> tuple[TrainModel, Optimizer | None]:
        return model, optimizer

    def sharding(self, model: TrainModel, ctx: Context) -> Sharding:
        layout: Layout = "replicated" if ctx.env.world_size == 1 else "per_rank"
        return Sharding(strategy=ctx.spec.name, params=layout, optimizer=layout,
                        dims=ctx.dims, mesh=ctx.mesh, data_rank=ctx.env.rank)


def describe(obj: Any = None) -> Sharding | None:
    """How the state of a model or optimizer returned by ``setup()`` is spread over the ranks.

    ``obj`` is the model or the optimizer ``setup()`` returned (None: the latest set up);
    None when ``setup()`` did not touch it.
    """
    state = state_of(obj)
    return state.sharding if state is not None else None
