"""A job program for the requeue test: train with a Checkpointer, stop on a signal, resume.

    requeue_job.py OUT TAIL

Each run writes OUT/started.<restart>.<rank>. The first run never finishes on its own: after
step 3 OUT/ready.0 appears (rank 0) and it trains on, one step every 0.2 s, until it is told to
stop (the Checkpointer saves and exits 75; the script requeues the job), so the test cannot
race the workload however slowly the signal travels. Only a bound (BOUND steps, minutes) ends
it otherwise, with exit 1 and a line saying it was never stopped. A resumed run trains TAIL more
steps from where it resumed, then trains a fresh model the same total straight in the same
process and writes OUT/result.<rank>.json: the step it resumed from and whether its parameters
and optimizer state equal the straight run.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

import scaletrain

BOUND = 1500   # x 0.2 s: the first run gives up after 5 minutes without a stop
out, tail = Path(sys.argv[1]), int(sys.argv[2])
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


def train(model, opt, start, end, ckpt=None, state=None):
    for step in range(start, end):
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
first = restart == "0"
total = BOUND if first else start + tail
train(model, opt, start, total, ckpt, state)
ckpt.close()
if first:   # the stop never came: Checkpointer.step raises SystemExit(75) when it does
    print(f"rank {env.rank}: trained {BOUND} steps and was never told to stop", flush=True)
    scaletrain.shutdown()
    sys.exit(1)
resumed = flat(model, opt)
model2, opt2 = build()
train(model2, opt2, 0, total)
straight = flat(model2, opt2)
equal = len(resumed) == len(straight) and all(torch.equal(a, b) for a, b in zip(resumed, straight))
(out / f"result.{env.rank}.json").write_text(json.dumps(
    {"start": start, "restart": restart, "equal": equal, "tensors": len(straight)}))
print(f"rank {env.rank} resumed from {start} equal {equal}", flush=True)
scaletrain.shutdown()
