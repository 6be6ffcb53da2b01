"""The PyTorch examples' DDP tutorial idiom: the local rank *is* the device (an integer)."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from agree import report

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(local_rank)
ddp = DDP(model, device_ids=[local_rank])
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(1 + dist.get_rank())
for step in range(4):
    x = torch.randn(16, 8, generator=gen).to(local_rank)
    y = torch.randn(16, 2, generator=gen).to(local_rank)
    loss = nn.functional.mse_loss(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
report(list(model.parameters()), loss=float(loss))
dist.destroy_process_group()
