"""Worker for the checkpoint tests: train, stop, resume, reshard - in real processes.

A small MLP with dropout and input noise (torch, Python and NumPy RNGs all change the
numbers), Adam, and a ``scaletrain.loader`` over 100 samples with a global batch of 8 (12
steps per epoch on 2 ranks, so a stop at step 10 is in the middle of an epoch).

Phases (``--phase``, several comma-separated run in order), each for every ``--strategies`` entry, one folder per strategy under
``--dir``:

``--strategies`` lists strategies, ``<strategy>:async`` for the same with ``async_save=True``.

- ``straight``: train ``--total`` steps; write ``straight-<strategy>-rank<R>.pt``.
- ``first``: train, saving through ``ckpt.step()`` (``--every-steps``), stop after ``--stop``
  steps (a final ``ckpt.save``), exit 0. With ``--wait-stop`` the loop instead runs until
  ``ckpt.step()`` stops it (a signal; the Checkpointer exits with code 75).
- ``resume``: ``load_latest`` then train to ``--total``; write ``resume-<strategy>-rank<R>.pt``.
  ``--sabotage rng|loader`` skips restoring that part (to prove the test can fail).
- ``reshard-save`` / ``reshard-load``: zero3 model + Adam saved by this world, loaded by
  another; write the full parameters (``full_tensor``) as ``reshard-<phase>-w<W>.pt``, and
  ``ckpt.export`` them to ``export-w<W>.pt``.
- ``pipeline``: 2 pipeline stages saved and loaded within the launch (``pipeline-rank<R>.json``).
- ``damaged``: ``load_latest`` of the zero3 folder ``--dir`` (a test damaged a file of its
  newest step); write the step loaded and the warnings seen to ``damaged-rank<R>.json``.

Each ``.pt`` holds this rank's local parameters and optimizer state (shards as they are on
this rank) and the sample indices it trained on.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import scaletrain

N_SAMPLES = 100
GLOBAL_BATCH = 8


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N_SAMPLES, 8, generator=g)
    y = torch.randint(0, 4, (N_SAMPLES,), generator=g)
    return TensorDataset(x, y, torch.arange(N_SAMPLES))


def build(strategy: str, rank: int, global_batch: int = GLOBAL_BATCH):
    torch.manual_seed(0)  # identical initial weights on every rank
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 32),
                          nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, opt = scaletrain.setup(model, opt, strategy=strategy)
    # per-rank streams, as a real script would have
    torch.manual_seed(100 + rank)
    random.seed(200 + rank)
    np.random.seed(300 + rank)
    loader = scaletrain.loader(dataset(), global_batch_size=global_batch, shuffle=True, seed=7,
                               num_workers=0)
    return model, opt, loader


def train_step(model, opt, batch) -> None:
    x, y, _ = batch
    scale = 1.0 + 0.01 * random.random() + 0.01 * float(np.random.rand())
    x = x * scale + 0.05 * torch.randn_like(x)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if hasattr(t, "to_local") else t).detach().cpu().clone()


def snapshot(model, opt, seen: list[int]) -> dict:
    inner = getattr(model, "module", model)
    names = {id(p): n for n, p in inner.named_parameters()}
    params = {n: local(p) for n, p in inner.named_parameters()}
    holder = opt.optim if hasattr(opt, "optim") else opt  # ZeroRedundancyOptimizer
    optim = {}
    for p, s in holder.state.items():
        for k, v in s.items():
            optim[f"{names[id(p)]}.{k}"] = local(v) if isinstance(v, torch.Tensor) else v
    return {"params": params, "optim": optim, "seen": seen}


def run(args, label: str, phase: str, env) -> None:
    """``label``: a strategy, or ``<strategy>:async`` for the same with async_save=True."""
    strategy, _, variant = label.partition(":")
    if phase == "straight" and variant:
        return  # an async save changes nothing in a straight run: compare with the plain one
    model, opt, loader = build(strategy, env.rank)
    state = {"model": model, "optimizer": opt, "loader": loader, "meta": {"strategy": strategy}}
    # a straight run checkpoints too (same cost as the real thing), but into its own folder
    folder = Path(args.dir) / ("straight" if phase == "straight" else "") / label.replace(":", "-")
    ckpt = scaletrain.Checkpointer(folder, keep=2, every_steps=args.every_steps,
                                   async_save=args.async_save or variant == "async")
    step = 0
    if phase == "resume":
        if args.sabotage == "loader":
            del state["loader"]
        step = ckpt.load_latest(state) or 0
        if args.sabotage == "rng":
            torch.manual_seed(100 + env.rank)
            random.seed(200 + env.rank)
            np.random.seed(300 + env.rank)
        assert step == args.stop, (step, args.stop)
        state["loader"] = loader
    target = args.total if phase != "first" or args.wait_stop else args.stop
    seen: list[int] = []
    model.train()
    while step < target:
        for batch in loader:
            train_step(model, opt, batch)
            seen.extend(batch[2].tolist())
            step += 1
            ckpt.step(step, state)  # saves when due; exits 75 on an agreed stop
            if step >= target:
                break
    if phase == "first" and not args.wait_stop:
        ckpt.save(step, state)
    ckpt.close()
    if phase in ("straight", "resume"):
        torch.save(snapshot(model, opt, seen),
                   Path(args.out) / f"{phase}-{label.replace(':', '-')}-rank{env.rank}.pt")


def probe_step(model, opt, env) -> None:
    """One deterministic step (no dropout, no noise) on a fixed batch of 12 split over ranks:
    after it the parameters depend on the loaded optimizer state, up to summation order."""
    x, y, _ = dataset()[:12]
    share = slice(env.rank * 12 // env.world_size, (env.rank + 1) * 12 // env.world_size)
    model.eval()
    loss = F.cross_entropy(model(x[share]), y[share])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def full_params(model) -> dict:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
            for n, p in getattr(model, "module", model).named_parameters()}


def reshard(args, phase: str, env) -> None:
    """zero3 saved by this world (phase reshard-save) or loaded by it (reshard-load)."""
    model, opt, loader = build("zero3", env.rank, global_batch=12)
    if phase == "reshard-save":
        for _, batch in zip(range(3), loader):
            train_step(model, opt, batch)
    ckpt = scaletrain.Checkpointer(Path(args.dir) / "reshard")
    state = {"model": model, "optimizer": opt}
    if phase == "reshard-save":
        ckpt.save(3, state)
    else:
        assert ckpt.load_latest(state) == 3
    out = {"params": full_params(model)}
    # export from this strategy: one file, a plain state_dict of the unwrapped model
    exported = ckpt.export(Path(args.out) / f"export-w{env.world_size}.pt", model)
    assert (exported is not None) == (env.rank == 0)
    ckpt.close()
    probe_step(model, opt, env)
    out["after_step"] = full_params(model)
    if env.rank == 0:
        torch.save(out, Path(args.out) / f"{phase}-w{env.world_size}.pt")


def damaged_case(args, env) -> None:
    model, opt, loader = build("zero3", env.rank)
    ckpt = scaletrain.Checkpointer(Path(args.dir), keep=2)
    state = {"model": model, "optimizer": opt, "loader": loader, "meta": {}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = ckpt.load_latest(state)
    ckpt.close()
    (Path(args.out) / f"damaged-rank{env.rank}.json").write_text(json.dumps(
        {"step": step, "warnings": [str(w.message) for w in caught]}))


def pipeline_case(args, env) -> None:
    """2 stages: train 3 steps, save, train 3 more; a fresh pipeline loads the checkpoint and
    trains the same 3 steps: every stage's parameters and Adam state must be bitwise equal."""
    import json

    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                              nn.Linear(32, 4))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        return scaletrain.setup(model, opt, strategy="pipeline", split_points=["2"],
                                loss_fn=F.cross_entropy, n_microbatches=2)

    x, y, _ = dataset()[:8]
    pipe, opt = make()
    for _ in range(3):
        pipe.step(x, y)
    ckpt = scaletrain.Checkpointer(Path(args.dir) / "pipeline")
    ckpt.save(3, {"model": pipe, "optimizer": opt})
    for _ in range(3):
        pipe.step(x, y)
    expect = snapshot_named(pipe, opt)
    pipe2, opt2 = make()
    step = ckpt.load_latest({"model": pipe2, "optimizer": opt2})
    ckpt.close()
    for _ in range(3):
        pipe2.step(x, y)
    got = snapshot_named(pipe2, opt2)
    equal = expect.keys() == got.keys() and all(torch.equal(expect[k], got[k]) for k in expect)
    marker = json.loads((Path(args.dir) / "pipeline" / "step-00000003" / "COMMIT.json")
                        .read_text())
    (Path(args.out) / f"pipeline-rank{env.rank}.json").write_text(json.dumps({
        "step": step, "equal": equal, "tensors": len(expect), "stage": pipe.stage_index,
        "objects": marker["objects"]}))


def snapshot_named(pipe, opt) -> dict:
    names = {id(p): n for n, p in pipe.named_parameters()}
    out = {f"param.{n}": p.detach().clone() for n, p in pipe.named_parameters()}
    for p, s in opt.state.items():
        for k, v in s.items():
            out[f"optim.{names[id(p)]}.{k}"] = v.detach().clone()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", required=True,
                        help="comma-separated: straight, first, resume, reshard-save, reshard-load")
    parser.add_argument("--strategies", default="ddp,zero1,zero3")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--total", type=int, default=20)
    parser.add_argument("--stop", type=int, default=10)
    parser.add_argument("--every-steps", type=int, default=None)
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--wait-stop", action="store_true")
    parser.add_argument("--sabotage", choices=["rng", "loader"], default=None)
    args = parser.parse_args()
    env = scaletrain.init()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for phase in args.phase.split(","):
        if phase.startswith("reshard"):
            reshard(args, phase, env)
        elif phase == "pipeline":
            pipeline_case(args, env)
        elif phase == "damaged":
            damaged_case(args, env)
        elif phase in ("straight", "first", "resume"):
            for strategy in args.strategies.split(","):
                run(args, strategy, phase, env)
        else:
            parser.error(f"unknown phase {phase!r}")
    scaletrain.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
