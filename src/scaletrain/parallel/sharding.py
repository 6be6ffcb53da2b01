"""What a checkpoint needs to know of a set-up model: which state is split over ranks, and how.

A leaf of ``parallel/``: the strategies (through ``strategy.py``) build a :class:`Sharding`, and
the precision state that ``setup()`` attaches to a model keeps one, so both import it from here
and neither imports the other for it. Nothing here imports torch at import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from scaletrain.parallel.options import ParallelDims

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh


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
