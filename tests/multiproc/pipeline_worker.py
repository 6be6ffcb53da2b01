"""Worker for test_pipeline_equivalence.py: pipeline (x data parallel) vs one process.

Run on 2 ranks (2 stages) or 4 ranks (2 stages x 2 replicas). Every case builds the same
seeded model, trains a copy in this process on the whole global batch (the reference, rank 0
only) and the pipeline on its share, then compares all parameters after K steps. Also
records the error messages of misuse and two deliberately broken variants that the
equivalence check must catch. Rank 0 writes one JSON file.
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
from scaletrain.errors import ScaletrainError
from scaletrain.parallel import pipeline

STEPS = 5
GLOBAL_BATCH = 64
N_MICRO = 4


from parallel_models import CifarCNN as CNN  # noqa: E402  (the example's CNN)


class MeanPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


def transformer() -> nn.Sequential:
    """A small transformer classifier as a Sequential: split by child names, no tracing.

    No biases in the blocks (as in LLaMA): the attention key bias has an exactly zero
    gradient (softmax ignores a constant shift), so Adam turns its rounding noise, which
    differs with any change of summation order, into full-size steps of random sign.
    """
    return nn.Sequential(
        nn.Linear(8, 32),
        nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, bias=False),
        nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, bias=False),
        MeanPool(),
        nn.Linear(32, 10),
    )


def make_model(kind: str) -> nn.Module:
    torch.manual_seed(1234)
    return CNN() if kind == "cnn" else transformer()


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    # Adam turns rounding noise in near-zero gradients into steps of size ~lr; 5e-4 keeps
    # that (a few 1e-6 for any change of summation order, even in one process) under 1e-5
    return torch.optim.Adam(params, lr=5e-4)


def batches(kind: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(99)
    shape = (GLOBAL_BATCH, 3, 32, 32) if kind == "cnn" else (GLOBAL_BATCH, 6, 8)
    return [(torch.randn(shape, generator=g), torch.randint(0, 10, (GLOBAL_BATCH,), generator=g))
            for _ in range(STEPS)]


def reference(kind: str, opt_name: str) -> tuple[dict[str, torch.Tensor], list[float]]:
    model = make_model(kind)
    opt = make_optimizer(opt_name, model.parameters())
    losses = []
    for x, y in batches(kind):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.named_parameters()}, losses


class DropOneMicrobatch:
    """Broken on purpose: the loss of every 4th micro-batch counts for nothing."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = F.cross_entropy(out, target)
        return loss * 0.0 if self.calls % N_MICRO == 0 else loss


def run_case(name: str, kind: str, opt_name: str, schedule: str, how: str, world: int,
             rank: int, data_parallel: str = "ddp", broken: str | None = None,
             via_setup: bool = False) -> dict:
    model = make_model(kind)
    opt = make_optimizer(opt_name, model.parameters())
    data = batches(kind)
    n_stages = 2
    replicas = world // n_stages
    per_replica = GLOBAL_BATCH // replicas
    replica = rank // n_stages
    options: dict = {"n_microbatches": N_MICRO, "schedule": schedule,
                     "loss_fn": DropOneMicrobatch() if broken == "drop_microbatch"
                     else F.cross_entropy,
                     "data_parallel": data_parallel, "broadcast_loss": True}
    if how == "split_points" and kind == "cnn":
        options.update(split_points=["fc1"],
                       example_input=data[0][0][:per_replica])  # traced: not a Sequential
    elif how == "split_points":
        options.update(split_points=["2"])
    else:
        options.update(stages=[model[:2], model[2:]])
    if via_setup:  # the public entry point, which dispatches to pipeline.apply
        pipe, popt = scaletrain.setup(model, opt, strategy="pipeline", **options)
    else:
        pipe, popt = pipeline.apply(model, opt, None, **options)
    if broken == "no_replica_average":
        pipe.stage.submod = pipe.module  # bypass DDP: replicas no longer average gradients
    losses = []
    for x, y in data:
        xs = x[replica * per_replica:(replica + 1) * per_replica]
        ys = y[replica * per_replica:(replica + 1) * per_replica]
        loss = pipe.step(xs, ys)
        losses.append(float(loss))
    full = pipe.full_state_dict()
    # forward-only: the last stage's outputs equal the gathered model's on the same inputs
    x_eval = data[0][0][replica * per_replica:(replica + 1) * per_replica]
    y_eval = data[0][1][replica * per_replica:(replica + 1) * per_replica]
    evaluated = pipe.evaluate(x_eval, y_eval)
    gap = torch.zeros(())
    if pipe.is_last:
        out, eval_loss = evaluated
        whole = make_model(kind)
        whole.load_state_dict(full)
        with torch.no_grad():
            expect = whole(x_eval)
            gap = torch.maximum((out - expect).abs().max(),
                                (eval_loss - F.cross_entropy(expect, y_eval)).abs())
    # checkpoint round trip: load the initial weights into the stages, gather them back
    initial = dict(make_model(kind).named_parameters())
    pipe.load_full_state_dict(initial)
    reloaded = pipe.full_state_dict()
    gap = torch.maximum(gap, max((reloaded[k] - initial[k]).abs().max() for k in initial))
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    result = {"name": name, "stage": pipe.stage_index, "owned": len(pipe.named_parameters()),
              "eval_diff": gap.item()}
    if rank == 0:
        ref, ref_losses = reference(kind, opt_name)
        result.update(
            keys_match=sorted(full) == sorted(ref),
            max_param_diff=max((full[k] - ref[k]).abs().max().item() for k in ref),
            max_loss_diff=max(abs(a - b) for a, b in zip(losses, ref_losses)),
            moved=max((ref[k] - v).abs().max().item()
                      for k, v in make_model(kind).named_parameters()),
            stage_of=pipe.stage_of,
            describe=pipe.describe(),
            optimizer_params=sum(len(g["params"]) for g in popt.param_groups),
            model_params=len(list(model.parameters())),
        )
    return result


def expect_error(fn) -> dict:
    try:
        fn()
    except ScaletrainError as exc:
        return {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint}
    except Exception as exc:  # the wrong kind of error is a finding too
        return {"type": type(exc).__name__, "message": str(exc), "hint": ""}
    return {"type": None, "message": "", "hint": ""}


def error_cases(world: int) -> dict:
    def model_opt():
        model = make_model("cnn")
        return model, make_optimizer("sgd", model.parameters())

    out = {}
    m, o = model_opt()
    out["unknown_split"] = expect_error(lambda: pipeline.apply(
        m, o, None, split_points=["fc9"], loss_fn=F.cross_entropy,
        example_input=torch.randn(8, 3, 32, 32)))
    m, o = model_opt()
    out["indivisible_world"] = expect_error(lambda: pipeline.apply(
        m, o, None, split_points=["conv2", "fc1", "fc2"] if world == 2 else ["conv2", "fc1"],
        loss_fn=F.cross_entropy, example_input=torch.randn(12, 3, 32, 32), schedule="gpipe"))
    m, o = model_opt()
    out["no_example"] = expect_error(lambda: pipeline.apply(
        m, o, None, split_points=["fc1"], loss_fn=F.cross_entropy))
    seq = transformer()
    pipe, _ = pipeline.apply(seq, torch.optim.SGD(seq.parameters(), lr=0.1), None,
                             split_points=["2"], loss_fn=F.cross_entropy)
    out["indivisible_batch"] = expect_error(lambda: pipe.step(torch.randn(30, 6, 8),
                                                             torch.randint(0, 10, (30,))))
    out["called_like_module"] = expect_error(lambda: pipe(torch.randn(4, 6, 8)))
    m, o = model_opt()
    traced, _ = pipeline.apply(m, o, None, split_points=["fc1"], loss_fn=F.cross_entropy,
                               example_input=torch.randn(8, 3, 32, 32))
    out["traced_other_size"] = expect_error(lambda: traced.step(
        torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))))
    return out


CASES_2 = [
    # name, model, optimizer, schedule, split method
    ("cnn_gpipe_sgd", "cnn", "sgd", "gpipe", "split_points"),
    ("cnn_gpipe_adam", "cnn", "adam", "gpipe", "split_points"),
    ("cnn_1f1b_sgd", "cnn", "sgd", "1f1b", "split_points"),
    ("cnn_1f1b_adam", "cnn", "adam", "1f1b", "split_points"),
    ("tf_gpipe_adam", "tf", "adam", "gpipe", "split_points"),
    ("tf_1f1b_sgd", "tf", "sgd", "1f1b", "split_points"),
    ("tf_1f1b_adam_stages", "tf", "adam", "1f1b", "stages"),
]
CASES_4 = [
    ("cnn_gpipe_sgd", "cnn", "sgd", "gpipe", "split_points"),
    ("tf_1f1b_adam_stages", "tf", "adam", "1f1b", "stages"),
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    args = parser.parse_args()
    env = scaletrain.init()
    rank, world = env.rank, env.world_size
    torch.set_num_threads(1)
    results: dict = {"world": world, "cases": {}, "errors": {}}
    try:
        cases = CASES_2 if world == 2 else CASES_4
        for name, kind, opt_name, schedule, how in cases:
            if args.only not in name:
                continue
            results["cases"][name] = run_case(name, kind, opt_name, schedule, how, world, rank,
                                              via_setup=name.endswith("_stages"))
        if world == 4:
            results["cases"]["tf_1f1b_adam_fsdp"] = run_case(
                "tf_1f1b_adam_fsdp", "tf", "adam", "1f1b", "split_points", world, rank,
                data_parallel="fsdp")
            results["cases"]["broken_no_replica_average"] = run_case(
                "broken_no_replica_average", "tf", "sgd", "1f1b", "split_points", world, rank,
                broken="no_replica_average")
        else:
            results["cases"]["broken_drop_microbatch"] = run_case(
                "broken_drop_microbatch", "cnn", "sgd", "1f1b", "split_points", world, rank,
                broken="drop_microbatch")
            results["errors"] = error_cases(world)
    except Exception:
        # the other ranks may wait forever in a send/recv with this one: leave at once,
        # the launcher stops them all
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        os._exit(1)
    if rank == 0:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    dist.barrier()
    scaletrain.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
