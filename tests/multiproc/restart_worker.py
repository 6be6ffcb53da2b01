"""Train 10 DDP steps with a Checkpointer every 5 steps (tests/multiproc/test_launch_restart.py).

Usage: restart_worker.py OUT_DIR MODE
  straight : no failure
  crash    : on the first attempt rank 1 raises at step 7 (after the step-5 checkpoint)
Writes OUT_DIR/attempt<A>.rank<R>.json: {"start": resumed step, "params": [...], "steps": [...]}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

import scaletrain

out, mode = Path(sys.argv[1]), sys.argv[2]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
TOTAL, EVERY = 10, 5

env = scaletrain.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.05)
model, opt = scaletrain.setup(model, opt, strategy="ddp")
ckpt = scaletrain.Checkpointer(out / "ckpt", keep=2, every_steps=EVERY)
state = {"model": model, "optimizer": opt}
start = ckpt.load_latest(state) or 0

steps = []
for step in range(start, TOTAL):
    g = torch.Generator().manual_seed(1000 * step + env.rank)  # this rank's batch of this step
    x = torch.randn(16, 4, generator=g)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps.append(step + 1)
    if mode == "crash" and attempt == 0 and env.rank == 1 and step + 1 == 7:
        raise RuntimeError("rank 1 fails at step 7")
    ckpt.step(step + 1, state)
ckpt.close()

params = [p.detach().double().flatten().tolist() for p in model.parameters()]
(out / f"attempt{attempt}.rank{env.rank}.json").write_text(
    json.dumps({"start": start, "params": params, "steps": steps}))
