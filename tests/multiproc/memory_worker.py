"""Worker for test_memory_measured.py: per-rank tensor bytes after setup() vs estimate_memory.

For each strategy, build the same model, ``scaletrain.setup(model, Adam, strategy=s)``, train
two steps and measure this rank's local bytes (local shards of DTensors):

- parameters: the most held at once, at rest or right after forward (zero2 keeps them
  gathered from forward to backward, which is what the ZeRO accounting counts);
- gradients: after backward;
- optimizer state: after the optimizer step (ZeroRedundancyOptimizer: its local optimizer).

Rank 0 writes every rank's figures and the estimates to one JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import scaletrain
from scaletrain.parallel.memory import estimate_memory

WIDTH = 256
LAYERS = 4


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(LAYERS):
        mods += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*mods)


def local_bytes(t: torch.Tensor) -> int:
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.numel() * t.element_size()


def param_bytes(params) -> int:
    seen: set[int] = set()
    total = 0
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            total += local_bytes(p)
    return total


def grad_bytes(params) -> int:
    return sum(local_bytes(p.grad) for p in params if p.grad is not None)


def state_bytes(opt) -> int:
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its shard's optimizer
    return sum(local_bytes(v) for st in inner.state.values() for v in st.values()
               if isinstance(v, torch.Tensor))


def measure(strategy: str, world: int) -> dict:
    model = make_model()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    xs = [torch.randn(16, WIDTH, generator=g) for _ in range(2)]
    ys = [torch.randn(16, WIDTH, generator=g) for _ in range(2)]
    est_kwargs: dict = {}
    if strategy == "pipeline":
        pipe, opt = scaletrain.setup(model, opt, strategy="pipeline", split_points=["4"],
                                     n_microbatches=2, schedule="gpipe",
                                     loss_fn=F.mse_loss)
        params = pipe.parameters()
        at_rest = param_bytes(params)
        for x, y in zip(xs, ys):
            pipe.step(x, y)
        # grads survive the step (zero_grad comes first in the next one)
        out = {"params": at_rest, "params_at_rest": at_rest, "grads": grad_bytes(params),
               "optimizer_state": state_bytes(opt)}
        est_kwargs["pipeline_stages"] = 2
    else:
        # min_params: give every Linear its own FSDP unit, so zero3 reshards all of them
        # after forward (the root keeps no parameters of its own)
        options = {"min_params": 1000} if strategy in ("zero2", "zero3") else {}
        model, opt = scaletrain.setup(model, opt, strategy=strategy, **options)
        at_rest = param_bytes(model.parameters())
        after_forward = grads = 0
        for x, y in zip(xs, ys):
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x), y)
            after_forward = max(after_forward, param_bytes(model.parameters()))
            loss.backward()
            grads = grad_bytes(model.parameters())
            opt.step()
        out = {"params": max(at_rest, after_forward), "params_at_rest": at_rest,
               "grads": grads, "optimizer_state": state_bytes(opt)}
    out["total"] = out["params"] + out["grads"] + out["optimizer_state"]
    est = estimate_memory(n_params, optimizer="adam", precision="fp32", strategy=strategy,
                          world_size=world, **est_kwargs)
    out["estimate"] = {"params": est.params, "grads": est.grads,
                       "optimizer_state": est.optimizer_state, "total": est.total}
    out["full_param_bytes"] = n_params * 4
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    env = scaletrain.init()
    torch.set_num_threads(1)
    results: dict = {"world": env.world_size, "strategies": {}}
    try:
        for strategy in ("ddp", "zero1", "zero2", "zero3", "pipeline"):
            mine = measure(strategy, env.world_size)
            every: list = [None] * env.world_size
            dist.all_gather_object(every, mine)
            results["strategies"][strategy] = every
    except Exception:
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        os._exit(1)  # peers may be blocked in a collective; the launcher stops them
    if env.rank == 0:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    dist.barrier()
    scaletrain.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
