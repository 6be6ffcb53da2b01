"""One 2-process job for benchmarks/clean_exit.py: train 4 DDP steps and end in one of three ways.

Usage: clean_exit_worker.py CKPT_DIR MODE
  plain : train, then return from the script (expected exit 0)
  save  : train, save a checkpoint (Checkpointer.save), return (expected exit 0)
  stop  : rank 0 sends itself SIGUSR1 (a time-limit signal) after step 2; the Checkpointer's
          stop agreement makes every rank save the same step and exit 75 (EXIT_STOPPED)
"""

from __future__ import annotations

import os
import signal
import sys

import torch

import scaletrain

ckpt_dir, mode = sys.argv[1], sys.argv[2]
env = scaletrain.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = scaletrain.setup(model, opt, strategy="ddp")
ckpt = scaletrain.Checkpointer(os.path.join(ckpt_dir, f"r{os.getppid()}"), keep=1)
state = {"model": model, "optimizer": opt}
for step in range(4):
    x = torch.randn(32, 8)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if mode == "stop":
        if step == 1 and env.rank == 0:
            os.kill(os.getpid(), signal.SIGUSR1)
        ckpt.step(step + 1, state)  # saves and raises SystemExit(75) once the stop is agreed
if mode == "save":
    ckpt.save(4, state)
ckpt.close()
