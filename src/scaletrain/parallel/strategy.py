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
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

from scaletrain.parallel.options import ParallelDims, StrategyOptions, StrategySpec
from scaletrain.parallel.options import PrecisionSpec
from scaletrain.parallel.precision import state_of

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.optim import Optimizer

    from scaletrain.parallel.pipeline_model import PipelineModel
    from scaletrain.runtime.env import Env

    # what a strategy returns to train with: a module, or one rank's pipeline stage
    TrainModel: TypeAlias = nn.Module | PipelineModel

MESH_DIMS: tuple[str, ...] = ("replicate", "shard", "pipeline")

Layout = Literal["replicated", "per_rank", "partitioned", "sharded", "staged"]
"""How one kind of state (parameters, optimizer state) is spread over the ranks:

- ``replicated``: every rank holds the same full state (one rank may save it for all);
- ``per_rank``: every rank holds its own, different full state (``none`` on several
  processes: each rank trains its own copy);
- ``partitioned``: ZeroRedundancyOptimizer - each rank holds the full state of a subset of
  the parameters, as plain tensors (``optimizer.consolidate_state_dict()`` gathers them);
- ``sharded``: FSDP2 DTensors sharded over the mesh's ``shard`` dimension (replicated over
  ``replicate``); torch.distributed.checkpoint saves a shard per rank and reshards on load;
- ``staged``: pipeline - each stage holds different parameters (under the model's own names,
  ``PipelineModel.named_parameters()``); ``Sharding.within_stage`` says how a stage's state
  is spread over its replicas.
"""


@dataclass(frozen=True, kw_only=True)
class Context:
    """What every strategy's ``apply`` gets besides the model and the optimizer."""

    env: Env
    spec: StrategySpec
    dims: ParallelDims
    mesh: DeviceMesh | None
    options: StrategyOptions
    precision: PrecisionSpec


@dataclass(frozen=True, kw_only=True)
class Sharding:
    """Which state of a set-up model is split over ranks, how, and over which mesh.

    Attributes:
        strategy: the strategy that ran (``none`` when ddp/zero* had a world of one).
        params: layout of the model's parameters (and gradients).
        optimizer: layout of the optimizer's state.
        within_stage: pipeline only: ``replicated`` (DDP or one replica) or ``sharded``
            (FSDP) across the replicas of one stage; None for other strategies.
        dims: the degrees, ``replicate x shard x pipeline == world size``.
        mesh: the DeviceMesh (dimension names in ``mesh.mesh_dim_names``), None without a
            process group or for ``none``.
        stage: this rank's pipeline stage (None when not a pipeline); ``n_stages`` of them.
        data_rank: this rank's index among the ranks holding the same part of the model
            (``rank // n_stages``); data rank 0 of each stage may write replicated state.
    """

    strategy: str
    params: Layout
    optimizer: Layout
    within_stage: Layout | None = None
    dims: ParallelDims
    mesh: DeviceMesh | None = None
    stage: int | None = None
    n_stages: int = 1
    data_rank: int = 0

    @property
    def sharded(self) -> bool:
        """True when any state differs between ranks that a checkpoint must keep apart."""
        return self.params != "replicated" or self.optimizer != "replicated"

    def layout_of(self, obj: Any) -> Layout:
        """The layout of ``obj``: the optimizer's for an optimizer, else the parameters'."""
        return self.optimizer if hasattr(obj, "param_groups") else self.params

    def group(self, dim: str) -> ProcessGroup | None:
        """The process group of mesh dimension ``dim`` for this rank, None if it has none."""
        if self.mesh is None or dim not in (self.mesh.mesh_dim_names or ()):
            return None
        return self.mesh.get_group(dim)


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
