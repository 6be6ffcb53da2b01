"""Worker for test_fsdp_mean.py: FSDP2's gradients are the mean over ranks, whatever the torch.

4 ranks (gloo). Each case builds the same small model, takes one backward through
``scaletrain.setup()`` with zero3 (mesh (4,)) and hsdp (mesh (2, 2)) on the rank's slice of one
global batch, and records the largest difference of the full gradients from one process's
on the whole batch - or the error that ``setup()`` raised. The cases replay, on this torch,
the collectives of the releases that differ (docs/torch-support.md):

- ``native``: this torch as it is;
- ``rs-sums``: torch 2.8.0 over gloo: ``reduce_scatter_tensor`` takes ``ReduceOp.AVG`` and sums;
- ``rs-sums-old-fsdp``: torch 2.7.1 over gloo: the same, ``all_reduce`` refuses ``AVG``
  (as gloo does there), and FSDP2 has no ``set_force_sum_reduction_for_comms``;
- ``rs-sums-no-fix``: the same as 2.7.1 with no ``set_all_reduce_hook`` either.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from workers import save_and_shutdown

import scaletrain
from scaletrain.errors import StrategyError

GLOBAL_BATCH = 16


@contextlib.contextmanager
def release(case: str) -> Iterator[None]:
    """Make this torch's collectives and FSDP2 behave as the release ``case`` stands for."""
    from torch.distributed.fsdp import FSDPModule

    # FSDP2 reduce-scatters through reduce_scatter_tensor (2.7-2.12) or reduce_scatter_single
    # (2.13), always with op= as a keyword
    scatters = [n for n in ("reduce_scatter_tensor", "reduce_scatter_single") if hasattr(dist, n)]
    saved = {name: getattr(dist, name) for name in (*scatters, "all_reduce")}
    hidden = tuple(name for name in {
        "rs-sums-old-fsdp": ("set_force_sum_reduction_for_comms",),
        "rs-sums-no-fix": ("set_force_sum_reduction_for_comms", "set_all_reduce_hook"),
    }.get(case, ()) if hasattr(FSDPModule, name))  # (2.7.1 has no force-sum to hide)
    saved_methods = {name: getattr(FSDPModule, name) for name in hidden}

    def summing(scatter):
        def call(*args, **kwargs):
            if kwargs.get("op") == dist.ReduceOp.AVG:
                kwargs["op"] = dist.ReduceOp.SUM  # what gloo's reduce-scatter did with AVG
            return scatter(*args, **kwargs)
        return call

    def refusing_all_reduce(*args, **kwargs):
        if kwargs.get("op") == dist.ReduceOp.AVG:
            raise RuntimeError("Cannot use ReduceOp.AVG with Gloo")  # gloo's words on 2.7.1
        return saved["all_reduce"](*args, **kwargs)

    if case != "native":
        for name in scatters:
            setattr(dist, name, summing(saved[name]))
    if case in ("rs-sums-old-fsdp", "rs-sums-no-fix"):
        dist.all_reduce = refusing_all_reduce
    for name in hidden:
        delattr(FSDPModule, name)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(dist, name, function)
        for name, method in saved_methods.items():
            setattr(FSDPModule, name, method)


def model_and_batch() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
    g = torch.Generator().manual_seed(1)
    return (model, torch.randn(GLOBAL_BATCH, 8, generator=g),
            torch.randint(0, 4, (GLOBAL_BATCH,), generator=g))


def one_case(case: str, strategy: str) -> dict:
    """One backward of ``strategy`` under ``case``: the gradients' difference from one process."""
    from torch.distributed.tensor import DTensor

    ref, x, y = model_and_batch()
    nn.functional.cross_entropy(ref(x), y).backward()
    want = {n: p.grad for n, p in ref.named_parameters()}
    model, _, _ = model_and_batch()
    rank, world = dist.get_rank(), dist.get_world_size()
    extra = {"mesh_shape": (2, 2)} if strategy == "hsdp" else {}
    with release(case):
        try:
            wrapped, _ = scaletrain.setup(model, strategy=strategy, min_params=100, **extra)
        except StrategyError as err:
            return {"raised": type(err).__name__, "message": err.message, "hint": err.hint}
        part = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
        nn.functional.cross_entropy(wrapped(x[part]), y[part]).backward()
    diff = 0.0
    for name, p in wrapped.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        diff = max(diff, float((grad - want[name]).abs().max()))
    size = float(max(g.abs().max() for g in want.values()))
    return {"diff": diff, "grad_max": size}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    scaletrain.init()
    results = {f"{case}/{strategy}": one_case(case, strategy)
               for case in ("native", "rs-sums", "rs-sums-old-fsdp", "rs-sums-no-fix")
               for strategy in ("zero3", "hsdp")}
    save_and_shutdown({"world_size": dist.get_world_size(), "results": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
