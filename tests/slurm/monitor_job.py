"""A job program for the after-submit test: trains with the Monitor and a Checkpointer.

    monitor_job.py OUT STEPS

Resumes from OUT/checkpoints, records every step in OUT/monitor (start_step = the resume point),
saves every 5 steps and whenever the job is asked to stop (USR1: requeue; USR2: cancel --save).
"""

import sys
import time
from pathlib import Path

import torch

import scaletrain

out, total = Path(sys.argv[1]), int(sys.argv[2])
env = scaletrain.init()
torch.manual_seed(0)
base = torch.nn.Linear(4, 1)
model, opt = scaletrain.setup(base, torch.optim.SGD(base.parameters(), lr=0.01), strategy="ddp")
state = {"model": model, "optimizer": opt}
ckpt = scaletrain.Checkpointer(out / "checkpoints", keep=2, every_steps=5)
start = ckpt.load_latest(state) or 0
mon = scaletrain.Monitor(out / "monitor", total_steps=total, start_step=start, console=False,
                         device_sampler=None, flush_s=0.2)
scaletrain.print(f"resumed at step {start}", ranks="all")
for step in range(start, total):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.25)
    mon.step(samples=8, loss=loss.detach())
    ckpt.step(step + 1, state)
mon.close()
ckpt.close()
scaletrain.print(f"finished at step {total}", ranks="all")
scaletrain.shutdown()
