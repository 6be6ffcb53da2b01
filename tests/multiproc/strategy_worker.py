"""Worker for the Strategy-interface tests: every strategy through ``scaletrain.setup()`` on
4 ranks, recording what ``scaletrain.parallel.describe()`` says (layouts, mesh, groups,
stage) beside the ground truth of the objects themselves (DTensor parameters, ZeRO
partitions, stage ownership); and the pipeline in bf16 against the same pipeline in fp32.

Rank 0 writes ``{case: [per-rank records]}`` as JSON. Usage: strategy_worker.py --out FILE
"""

from __future__ import annotations

import contextlib
import argparse
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from workers import save_and_shutdown

import scaletrain
from scaletrain.errors import ScaletrainError
from scaletrain.parallel import describe
from scaletrain.torch_features import fsdp_on_cpu

STEPS = 4
BATCH = 16  # per pipeline replica


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def facts(m, opt) -> dict:
    """What describe() says, next to what the objects are."""
    from torch.distributed.tensor import DTensor

    sh = describe(m)
    params = m.parameters() if callable(getattr(m, "parameters", None)) else []
    mesh = sh.mesh
    return {
        "strategy": sh.strategy, "params": sh.params, "optimizer": sh.optimizer,
        "optimizer_of_opt": describe(opt).layout_of(opt) if opt is not None else None,
        "within_stage": sh.within_stage, "stage": sh.stage, "n_stages": sh.n_stages,
        "data_rank": sh.data_rank, "sharded": sh.sharded,
        "dims": [sh.dims.replicate, sh.dims.shard, sh.dims.pipeline],
        "mesh_dims": list(mesh.mesh_dim_names) if mesh is not None else None,
        "mesh_shape": list(mesh.mesh.shape) if mesh is not None else None,
        "group_sizes": {d: dist.get_world_size(sh.group(d))
                        for d in (mesh.mesh_dim_names if mesh is not None else ())},
        "dtensor_params": any(isinstance(p, DTensor) for p in params),
        "zero_optimizer": type(opt).__name__ == "ZeroRedundancyOptimizer",
    }


def pipeline_losses(precision: str, rank: int) -> tuple[list[float], dict]:
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    pipe, popt = scaletrain.setup(m, opt, strategy="pipeline", precision=precision,
                                  split_points=["2"], n_microbatches=2, schedule="gpipe",
                                  loss_fn=F.cross_entropy, broadcast_loss=True)
    seen: set[str] = set()  # the dtype the stage's layers compute in
    for layer in pipe.module.modules():
        if isinstance(layer, nn.Linear):
            layer.register_forward_hook(lambda _m, _i, out: seen.add(str(out.dtype)))
    g = torch.Generator().manual_seed(7 + rank // 2)  # one batch stream per replica
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, 8, generator=g), torch.randint(0, 4, (BATCH,), generator=g)
        losses.append(float(pipe.step(x, y)))
    return losses, {"param_dtypes": sorted({str(p.dtype) for p in pipe.parameters()}),
                    "compute_dtypes": sorted(seen),
                    **facts(pipe, popt)}


@contextlib.contextmanager
def refused_without_fsdp_on_cpu(out: dict, case: str):
    """On a torch without FSDP2 on the CPU (2.6) an FSDP case is refused: record the line."""
    try:
        yield
    except ScaletrainError as exc:
        if fsdp_on_cpu():
            raise
        out[case] = {"refused": exc.render()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    env = scaletrain.init()
    torch.set_num_threads(1)
    out: dict = {}
    try:
        for name, kwargs in [("ddp", {}), ("zero1", {}), ("zero3", {}),
                             ("hsdp", {"mesh_shape": (2, 2)})]:
            m = model()
            opt = torch.optim.Adam(m.parameters(), lr=1e-3)
            with refused_without_fsdp_on_cpu(out, name):
                m, opt = scaletrain.setup(m, opt, strategy=name, **kwargs)
                out[name] = facts(m, opt)
        for dp in ("ddp", "fsdp"):
            m = model()
            opt = torch.optim.Adam(m.parameters(), lr=1e-3)
            with refused_without_fsdp_on_cpu(out, f"pipeline_{dp}"):
                pipe, popt = scaletrain.setup(m, opt, strategy="pipeline", split_points=["2"],
                                              n_microbatches=2, loss_fn=F.cross_entropy,
                                              data_parallel=dp)
                out[f"pipeline_{dp}"] = {**facts(pipe, popt), "owned": sorted(
                    n for n, _ in pipe.named_parameters())}
        fp32, out["pipeline_fp32"] = pipeline_losses("fp32", env.rank)
        bf16, out["pipeline_bf16"] = pipeline_losses("bf16", env.rank)
        out["pipeline_bf16"]["losses"] = bf16
        out["pipeline_bf16"]["fp32_losses"] = fp32
        try:
            pipeline_losses("fp16", env.rank)
            out["pipeline_fp16"] = {"error": None}
        except ScaletrainError as exc:
            out["pipeline_fp16"] = {"error": type(exc).__name__, "text": exc.render()}
    except Exception:
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        os._exit(1)
    gathered: list = [None] * env.world_size
    dist.all_gather_object(gathered, out)
    save_and_shutdown({case: [g[case] for g in gathered] for case in out}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
