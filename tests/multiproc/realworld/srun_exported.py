"""A program written for `srun python train.py` inside a batch script that exported
WORLD_SIZE and MASTER_ADDR; the rank comes from Slurm, the rest from the environment.

With `computed` as first argument it computes them from Slurm's variables itself, as some
course material does in Python instead of in the batch script.
"""

import os
import re
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

from agree import report

if sys.argv[1] == "computed":
    os.environ["WORLD_SIZE"] = str(int(os.environ["SLURM_NNODES"])
                                   * int(os.environ["SLURM_NTASKS_PER_NODE"]))
    first = re.sub(r"\[(\d+).*\]", r"\1", os.environ["SLURM_JOB_NODELIST"].split(",")[0])
    os.environ["MASTER_ADDR"] = first
rank = int(os.environ["SLURM_PROCID"])
world_size = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(3, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(2, 3) * (rank + 1)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
report(list(model.parameters()), exported_world=os.environ["WORLD_SIZE"])
dist.destroy_process_group()
