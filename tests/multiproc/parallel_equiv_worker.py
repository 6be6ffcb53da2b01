"""Worker for the strategy-equivalence tests: one launch runs every case of one world size.

Each process trains a plain, unwrapped reference model on the whole global batch itself
(deterministic on CPU), then trains the same model through ``scaletrain.setup()`` with each
strategy on its own slice of the batch, gathers the full parameters (``DTensor.full_tensor``)
and records the largest absolute difference from the reference. Rank 0 writes one JSON
file ``{case: {"diff": max over ranks, "moved": how far training moved the reference, ...}}``.

The loss is ``sum(cross_entropy) * W / G`` (W data-parallel ranks, G global batch): the
averaging strategies divide by W, so every strategy optimises the mean over the global batch
even when G is not divisible by W (3 ranks: slices of 22, 21, 21 samples).

Usage: parallel_equiv_worker.py --out results.json [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from parallel_models import MODELS, Block, make_data, make_optimizer

import scaletrain
from scaletrain.errors import StrategyError

GLOBAL_BATCH = 64
STEPS = 5
MODEL_NAMES = ("cnn", "transformer")
OPTIMIZERS = ("sgd", "adam")


def batch_slice(rank: int, world: int, n: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` samples (sizes differ by at most one)."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full fp32 copies of the parameters, by their original names, from any strategy."""
    from torch.distributed.tensor import DTensor

    inner = getattr(model, "module", model)  # DDP keeps the user's module in .module
    out = {}
    for name, p in inner.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out[name] = t.detach().float().cpu().clone()
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        raise RuntimeError(f"parameter names differ: {sorted(a.keys() ^ b.keys())}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def train(model_name: str, opt_kind: str, strategy: str | None, env, *, accumulate: int = 1,
          precision: str = "fp32", hook=None, plain_backward: bool = False, **options):
    """Train STEPS optimizer steps; strategy None = the unwrapped single-process reference."""
    torch.manual_seed(0)
    model = MODELS[model_name]()
    opt = make_optimizer(opt_kind, model)
    if strategy is None:
        rank, world = 0, 1
    else:
        model, opt = scaletrain.setup(model, opt, strategy=strategy, precision=precision,
                                      env=env, **options)
        state = model._scaletrain_state
        rank, world = env.rank, state.dims.data_parallel
        if hook is not None:
            model.register_comm_hook(state=None, hook=hook)
    xs, ys = make_data(model_name, STEPS, GLOBAL_BATCH)
    part = batch_slice(rank, world, GLOBAL_BATCH)
    acc = scaletrain.accumulate(model, accumulate) if accumulate > 1 else None
    for k in range(STEPS):
        x, y = xs[k, part], ys[k, part]
        if acc is None:
            loss = F.cross_entropy(model(x), y, reduction="sum") * world / GLOBAL_BATCH
            if plain_backward or strategy is None:
                loss.backward()
            else:
                scaletrain.backward(loss, model)
        else:
            # scaletrain.backward divides by the number of micro-steps: undo it in the loss
            # so that the sum over micro-steps is the full-batch loss.
            for xm, ym in zip(x.chunk(accumulate), y.chunk(accumulate)):
                with acc:
                    loss = F.cross_entropy(model(xm), ym, reduction="sum") * world / GLOBAL_BATCH
                    scaletrain.backward(loss * accumulate, model)
            assert acc.sync, "the last micro-step of a group must sync"
        opt.step()
        opt.zero_grad()
    return model, opt


def sum_hook(state, bucket):
    """A deliberately broken DDP comm hook: sums gradients without dividing by the world."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def local_bytes(model: nn.Module, opt) -> dict[str, int]:
    """Bytes of parameter shards and optimizer state this rank holds."""
    from torch.distributed.tensor import DTensor

    def size(t):
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = sum(size(p) for p in model.parameters())
    state = sum(size(v) for s in opt.state.values() for v in s.values()
                if isinstance(v, torch.Tensor) and v.ndim > 0)
    return {"params": params, "optimizer": state}


def cases(world: int):
    """(name, kwargs for train) for this world size."""
    fsdp_opts = {"min_params": 1000}  # small models: wrap their layers too, not only the root
    for m in MODEL_NAMES:
        for o in OPTIMIZERS:
            if world in (2, 3):
                yield f"ddp/{m}/{o}", dict(strategy="ddp")
            if world == 2:
                yield f"zero1/{m}/{o}", dict(strategy="zero1")
                yield f"zero2/{m}/{o}", dict(strategy="zero2", **fsdp_opts)
                yield f"zero3/{m}/{o}", dict(strategy="zero3", **fsdp_opts)
                yield f"offload/{m}/{o}", dict(strategy="offload", **fsdp_opts)
            if world == 4:
                yield f"hsdp/{m}/{o}", dict(strategy="hsdp", mesh_shape=(2, 2), **fsdp_opts)
    if world == 2:
        yield "fsdp-wrap-blocks/transformer/adam", dict(strategy="fsdp", wrap=(Block,))
        yield "ddp-options/cnn/sgd", dict(strategy="ddp", bucket_cap_mb=0.01, static_graph=True)
        yield "ddp-plain-backward/cnn/sgd", dict(strategy="ddp", plain_backward=True)
        yield "accumulate-ddp/cnn/sgd", dict(strategy="ddp", accumulate=2)
        yield "accumulate-ddp/transformer/adam", dict(strategy="ddp", accumulate=2)
        yield "accumulate-zero3/cnn/sgd", dict(strategy="zero3", accumulate=2, **fsdp_opts)
        yield "accumulate-zero3/transformer/adam", dict(strategy="zero3", accumulate=2,
                                                        **fsdp_opts)
        yield "broken-sum/cnn/sgd", dict(strategy="ddp", hook=sum_hook)
        for prec in ("bf16", "fp16"):
            # SGD: its update follows the gradient's size, so precision error shows as a
            # small fraction of how far training moves the weights (Adam's sign-like
            # first steps would hide it).
            yield f"{prec}-ddp/transformer/sgd", dict(strategy="ddp", precision=prec)
            yield f"{prec}-zero3/transformer/sgd", dict(strategy="zero3", precision=prec,
                                                        **fsdp_opts)
        yield "fp16-zero1/transformer/sgd", dict(strategy="zero1", precision="fp16")
        yield "bf16-offload/transformer/sgd", dict(strategy="offload", precision="bf16",
                                                   **fsdp_opts)


def extra_checks(env) -> dict[str, dict]:
    """Error paths and memory, world 2 only."""
    out: dict[str, dict] = {}
    # fp16 with a plain loss.backward(): refused at step() instead of wrong numbers.
    try:
        train("transformer", "sgd", "ddp", env, precision="fp16", plain_backward=True)
        out["fp16-plain-backward"] = {"raised": None}
    except StrategyError as err:
        out["fp16-plain-backward"] = {"raised": "StrategyError", "hint": err.hint}

    # An unused parameter: DDP's error comes back as a StrategyError with the fix.
    class Unused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 2), nn.Linear(4, 2)

        def forward(self, x):
            return self.used(x)

    model, _ = scaletrain.setup(Unused(), None, strategy="ddp", env=env)
    result = {"raised": None}
    try:
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
    except StrategyError as err:
        result = {"raised": "StrategyError", "hint": err.hint}
    out["ddp-unused-parameter"] = result
    dist.barrier()

    # strategy="pipeline" is dispatched to scaletrain.parallel.pipeline (tested in depth there):
    # 2 stages, 4 micro-batches, one step equals one unwrapped step.
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    ref = copy.deepcopy(seq)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = torch.randn(8, 8), torch.randn(8, 4)
    F.mse_loss(ref(x), y).backward()
    ref_opt.step()
    try:
        pm, _ = scaletrain.setup(seq, torch.optim.SGD(seq.parameters(), lr=0.1),
                                 strategy="pipeline", env=env, split_points=["2"],
                                 loss_fn=F.mse_loss, n_microbatches=4)
        pm.step(x, y)
        full = pm.full_state_dict()
        diff = max(float((full[k] - v).abs().max()) for k, v in ref.state_dict().items())
        out["pipeline-dispatch"] = {"type": type(pm).__name__, "diff": diff,
                                    "pipeline": pm._scaletrain_state.dims.pipeline}
    except Exception as err:
        out["pipeline-dispatch"] = {"error": f"{type(err).__name__}: {err}",
                                    "trace": traceback.format_exc()[-2000:]}

    # zero3 memory: each rank holds about 1/W of the parameter and optimizer-state bytes.
    torch.manual_seed(0)
    ref = MODELS["transformer"]()
    full = sum(p.numel() * p.element_size() for p in ref.parameters())
    model, opt = train("transformer", "adam", "zero3", env, min_params=1000)
    mem = local_bytes(model, opt)
    out["zero3-memory"] = {"full_param_bytes": full, **mem}
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    env = scaletrain.init(device="cpu")
    world = env.world_size
    results: dict[str, dict] = {}
    refs: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    inits: dict[str, dict[str, torch.Tensor]] = {}
    for name, kw in cases(world):
        if args.only and args.only not in name:
            continue
        _, model_name, opt_kind = name.split("/")
        t0 = time.perf_counter()
        if (model_name, opt_kind) not in refs:
            refs[model_name, opt_kind] = full_params(train(model_name, opt_kind, None, env)[0])
            torch.manual_seed(0)
            inits[model_name] = full_params(MODELS[model_name]())
        ref = refs[model_name, opt_kind]
        strategy = kw.pop("strategy")
        try:
            model, _ = train(model_name, opt_kind, strategy, env, **kw)
            got = full_params(model)
            results[name] = {"diff": max_diff(got, ref), "moved": max_diff(ref, inits[model_name]),
                             "self_moved": max_diff(got, inits[model_name]),
                             "finite": all(bool(torch.isfinite(t).all()) for t in got.values())}
            first = next(model.parameters())
            if hasattr(first, "placements"):  # DTensor: how the strategy laid it out
                results[name]["mesh"] = list(first.device_mesh.shape)
                results[name]["placements"] = str(first.placements)
            scaler = model._scaletrain_state.scaler
            if scaler is not None:
                results[name]["scaler"] = type(scaler).__name__
        except Exception as err:  # recorded, so one broken case does not hide the others
            results[name] = {"error": f"{type(err).__name__}: {err}",
                             "trace": traceback.format_exc()[-2000:]}
        results[name]["seconds"] = time.perf_counter() - t0
        dist.barrier()
    if world == 2 and not args.only:
        results.update(extra_checks(env))
    gathered: list[dict] = [None] * world  # type: ignore[list-item]
    dist.all_gather_object(gathered, results)
    if env.rank == 0:
        merged: dict[str, dict] = {}
        for name in results:
            per_rank = [g.get(name, {}) for g in gathered]
            merged[name] = {**per_rank[0], "per_rank": per_rank}
            diffs = [r["diff"] for r in per_rank if "diff" in r]
            if diffs:
                merged[name]["diff"] = max(diffs)
        with open(args.out, "w") as fh:
            json.dump({"world_size": world, "results": merged}, fh, indent=1)
    dist.barrier()  # nobody tears down its group while a peer is still in all_gather_object
    scaletrain.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
