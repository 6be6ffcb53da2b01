"""Shared by the real-world-shaped programs: after training, every rank's parameters are
gathered and rank 0 writes what the test checks (world size, agreement, the numbers)."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist


def report(params: list[torch.Tensor], **extra: object) -> None:
    """All-gather the flattened ``params`` (CPU copies) and write a summary to argv[-1]."""
    flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for p in params])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    if dist.get_rank() == 0:
        with open(sys.argv[-1], "w") as fh:
            json.dump({"world": dist.get_world_size(), "backend": str(dist.get_backend()),
                       "params_equal": all(torch.equal(g, gathered[0]) for g in gathered),
                       "first": [float(v) for v in gathered[0][:4]],
                       "sum": float(gathered[0].sum()), **extra}, fh)
    dist.barrier()
