"""Worker for the exact-resume-after-a-signal tests: a stop by signal, then a resume.

Usage: resume_worker.py OUT STRATEGY {stop,resume} [--steps 2N] [--signal-at K] [--sig USR1]

A small MLP trained with ``scaletrain.setup(strategy=STRATEGY)`` (Adam, so the optimizer has
state) on a shuffled ``scaletrain.loader`` of 48 samples, 8 per step globally (6 steps an
epoch), with the three lines of docs/long-jobs.md: a Checkpointer, ``load_latest``, and
``ckpt.step`` after every optimizer step.

- ``stop``: rank 0 sends itself SIG after step K; the agreement stops every rank one step
  later (mid-epoch), the Checkpointer saves, writes stop.json and exits with EXIT_STOPPED.
- ``resume``: a new process loads the latest checkpoint and trains to 2N; then, in the same
  process, a fresh model trains 2N steps straight. Each rank writes OUT/result-rank<R>.json:
  the step resumed from and whether every parameter and optimizer tensor of its shard is
  bitwise equal between the two.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import scaletrain
from scaletrain.runtime import agreement

# Agree at every step, so the stop lands exactly one step after the signal (step 5, in the
# middle of the first epoch) instead of up to ~2 sync periods later.
agreement.SYNC_PERIOD_S = 0

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("strategy")
parser.add_argument("mode", choices=["stop", "resume"])
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--signal-at", type=int, default=4)
parser.add_argument("--sig", default="USR1")
args = parser.parse_args()

env = scaletrain.init()


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model, opt = scaletrain.setup(model, opt, strategy=args.strategy)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    train = scaletrain.loader(data, global_batch_size=8, num_workers=0, seed=3)
    return model, opt, train


def train(model, opt, train_loader, start: int, total: int, ckpt=None, state=None) -> int:
    step = start
    while step < total:
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if ckpt is not None:
                if args.mode == "stop" and env.rank == 0 and step == args.signal_at:
                    os.kill(os.getpid(), getattr(signal, "SIG" + args.sig))
                ckpt.step(step, state)
            if step >= total:
                break
    return step


def local(value):
    """A tensor's local shard (DTensor) as a plain tensor; containers recursively."""
    if hasattr(value, "to_local"):
        return value.to_local()
    if isinstance(value, dict):
        return {k: local(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [local(v) for v in value]
    return value


def tensors(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from tensors(v, f"{prefix}/{k}")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from tensors(v, f"{prefix}/{i}")
    elif isinstance(tree, torch.Tensor):
        yield prefix, tree


def snapshot(model, opt) -> dict[str, torch.Tensor]:
    out = {"model" + k: v.detach().clone() for k, v in tensors(local(model.state_dict()))}
    # ZeroRedundancyOptimizer (zero1): this rank's shard is its local .optim
    shard = opt.optim if type(opt).__name__ == "ZeroRedundancyOptimizer" else opt
    out.update({"opt" + k: v.detach().clone() for k, v in tensors(local(shard.state_dict()))})
    return out


ckdir = args.out / "checkpoints"
model, opt, loader = build()
state = {"model": model, "optimizer": opt, "loader": loader}
ckpt = scaletrain.Checkpointer(ckdir, keep=2)
start = ckpt.load_latest(state) or 0
if args.mode == "stop":
    train(model, opt, loader, start, args.steps, ckpt, state)
    raise SystemExit("the stop signal did not stop the run")  # ckpt.step exits with 75

end = train(model, opt, loader, start, args.steps, ckpt, state)
resumed = snapshot(model, opt)
ckpt.close()
model2, opt2, loader2 = build()
train(model2, opt2, loader2, 0, args.steps)
straight = snapshot(model2, opt2)
moved = snapshot(*build()[:2])
result = {
    "rank": env.rank, "start": start, "end": end,
    "keys": sorted(straight), "same_keys": sorted(resumed) == sorted(straight),
    "unequal": [k for k in straight if k in resumed and not torch.equal(resumed[k], straight[k])],
    "moved": [k for k in straight if k.startswith("model") and k in moved
              and not torch.equal(moved[k], straight[k])],
}
(args.out / f"result-rank{env.rank}.json").write_text(json.dumps(result))
