"""A job program for the requeue test: train with a Checkpointer, stop on a signal, resume.

    requeue_job.py OUT STEPS

Each run writes OUT/started.<restart>.<rank>; after step 3 of each run OUT/ready.<restart>
appears (rank 0) and the steps slow down (0.2 s) so the test can signal the job. On a stop the
Checkpointer saves and exits 75 (the script requeues the job); a run that reaches STEPS trains
a fresh model STEPS steps straight in the same process and writes OUT/result.<rank>.json:
the step it resumed from and whether its parameters and optimizer state equal the straight run.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

import scaletrain

out, total = Path(sys.argv[1]), int(sys.argv[2])
env = scaletrain.init()
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
(out / f"started.{restart}.{env.rank}").write_text(str(os.getpid()))


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return scaletrain.setup(model, opt, strategy="ddp")


def batch(step: int):
    g = torch.Generator().manual_seed(1000 * step + env.rank)
    return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)


def train(model, opt, start, ckpt=None, state=None):
    for step in range(start, total):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if ckpt is None:
            continue
        if step + 1 == start + 3 and env.rank == 0:
            (out / f"ready.{restart}").write_text(str(step + 1))
        if step + 1 >= start + 3:
            time.sleep(0.2)
        ckpt.step(step + 1, state)


def flat(model, opt):
    tensors = [p.detach().clone() for p in model.parameters()]
    for s in opt.state_dict()["state"].values():
        tensors += [v.clone() for v in s.values() if isinstance(v, torch.Tensor)]
    return tensors


model, opt = build()
state = {"model": model, "optimizer": opt}
ckpt = scaletrain.Checkpointer(out / "checkpoints", keep=2)
start = ckpt.load_latest(state) or 0
train(model, opt, start, ckpt, state)
ckpt.close()
resumed = flat(model, opt)
model2, opt2 = build()
train(model2, opt2, 0)
straight = flat(model2, opt2)
equal = len(resumed) == len(straight) and all(torch.equal(a, b) for a, b in zip(resumed, straight))
(out / f"result.{env.rank}.json").write_text(json.dumps(
    {"start": start, "restart": restart, "equal": equal, "tensors": len(straight)}))
print(f"rank {env.rank} resumed from {start} equal {equal}", flush=True)
scaletrain.shutdown()
