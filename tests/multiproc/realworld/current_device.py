"""`torch.cuda.set_device(LOCAL_RANK)`, then `x.to(torch.cuda.current_device())` (an integer)."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn

from agree import report

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
torch.manual_seed(0)
model = nn.Linear(4, 4).to(torch.cuda.current_device())
model = nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(5, 4).to(torch.cuda.current_device())
    x = x * (dist.get_rank() + 1)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
report(list(model.parameters()), current=torch.cuda.current_device())
dist.destroy_process_group()
