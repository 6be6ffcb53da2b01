"""`device = torch.device(rank)`, then `.to(device)` and `device=device` everywhere."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn

from agree import report

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl", device_id=torch.device(local_rank))
device = torch.device(local_rank)
torch.manual_seed(0)
net = nn.Linear(6, 1).to(device)
ddp = nn.parallel.DistributedDataParallel(net, device_ids=[device])
opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
for step in range(4):
    x = torch.rand(12, 6, device=device) + dist.get_rank()
    y = torch.ones(12, 1, device=device)
    loss = (ddp(x) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
report(list(net.parameters()), device=str(next(net.parameters()).device))
dist.destroy_process_group()
