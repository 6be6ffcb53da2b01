"""Worker for tests/multiproc/test_observe_multiproc.py: DDP with a Monitor; rank 1 is slowed.

Rank 1 sleeps before each forward pass, so every rank's step takes as long as rank 1's (they
meet in the gradient all-reduce) and only the wait measured by ``Monitor.watch`` tells them apart.
"""

from __future__ import annotations

import argparse
import time

import torch

import scaletrain
from scaletrain.observe.monitor import Monitor

p = argparse.ArgumentParser()
p.add_argument("--run-dir", required=True)
p.add_argument("--slow-rank", type=int, default=1)
p.add_argument("--sleep", type=float, default=0.03)
p.add_argument("--steps", type=int, default=30)
args = p.parse_args()

env = scaletrain.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt = scaletrain.setup(model, opt, strategy="ddp")
monitor = Monitor(args.run_dir, total_steps=args.steps, every=5, console=False, device_sampler=None)
assert monitor.watch(model), "the model should be DDP-wrapped"
x = torch.randn(16, 64)
monitor.start()
for _ in range(args.steps):
    if env.rank == args.slow_rank:
        time.sleep(args.sleep)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    monitor.step(samples=16, loss=loss)
monitor.close()
scaletrain.shutdown()
