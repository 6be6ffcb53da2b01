"""The few collectives a checkpoint needs, on its own gloo process group.

A separate group keeps checkpoint traffic (which an async save runs in a background thread)
out of the training's collective order, and works for CPU objects under NCCL jobs too. With no
process group (one plain process) every call is local.
"""

from __future__ import annotations

from typing import Any

from scaletrain import module_state
from scaletrain.runtime.gloo import new_lazy_group


class Comm:
    """Rank, world size, and object collectives for the checkpointer."""

    def __init__(self) -> None:
        import torch.distributed as dist

        from scaletrain.runtime.current import group_rank_world

        rank, world = group_rank_world()
        self.distributed = world > 1
        self.rank = rank if self.distributed else 0
        self.world_size = world
        self.group: Any = _checkpoint_group(dist) if self.distributed else None

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        from scaletrain.runtime import collectives

        return collectives.broadcast_object(obj, src=0, group=self.group)

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (a list by rank); None elsewhere."""
        if not self.distributed:
            return [obj]
        from scaletrain.runtime import collectives

        return collectives.gather_objects(obj, dst=0, group=self.group)

    def close(self) -> None:
        """Let go of the group (at the Checkpointer's close). It stays for the next
        Checkpointer of the process and ends with the process group it belongs to."""
        self.group = None


# One gloo group for every Checkpointer of the process, made at the first one's first save or
# load (every rank makes it at the same call, as new_group requires) and kept while the default
# group it was made under lives. A group per Checkpointer, destroyed at its close, hung on torch
# 2.6: a rank whose peer had destroyed the group and gone on waited in its own destroy.
_GROUP: tuple[Any, Any] | None = None   # (the default group it was made under, the group)
module_state.register(__name__, "_GROUP")


def _checkpoint_group(dist: Any) -> Any:
    global _GROUP
    world = dist.group.WORLD
    if _GROUP is None or _GROUP[0] is not world:
        # connected lazily: an eager gloo group of N ranks reads N^2 addresses from the store
        # (scaletrain.runtime.gloo; docs/scale.md)
        _GROUP = (world, new_lazy_group(dist))
    return _GROUP[1]
