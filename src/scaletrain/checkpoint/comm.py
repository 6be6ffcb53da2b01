"""The few collectives a checkpoint needs, on its own gloo process group.

A separate group keeps checkpoint traffic (which an async save runs in a background thread)
out of the training's collective order, and works for CPU objects under NCCL jobs too. With no
process group (one plain process) every call is local.
"""

from __future__ import annotations

from typing import Any


class Comm:
    """Rank, world size, and object collectives for the checkpointer."""

    def __init__(self) -> None:
        import torch.distributed as dist

        from scaletrain.runtime.current import group_rank_world

        rank, world = group_rank_world()
        self.distributed = world > 1
        self.rank = rank if self.distributed else 0
        self.world_size = world
        # Every rank creates the group at the same call (the first save or load).
        self.group: Any = dist.new_group(backend="gloo") if self.distributed else None

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (a list by rank); None elsewhere."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.group)
        return out

    def close(self) -> None:
        """Destroy the group (at the Checkpointer's close; all ranks call it)."""
        if self.group is not None:
            from scaletrain.runtime.current import live_dist

            dist = live_dist()
            if dist is not None:  # not when the program destroyed its group first
                try:
                    dist.destroy_process_group(self.group)
                except (RuntimeError, ValueError):
                    pass
            self.group = None
