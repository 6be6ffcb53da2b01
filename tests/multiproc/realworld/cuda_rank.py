"""Course-material style: every placement is `.cuda(rank)`; the rank from torchrun's RANK."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn

from agree import report

rank = int(os.environ["RANK"])
dist.init_process_group(backend="nccl", init_method="env://")
torch.cuda.manual_seed_all(0)
torch.manual_seed(0)
model = nn.Linear(10, 3).cuda(rank)
model = nn.parallel.DistributedDataParallel(model, device_ids=[rank], output_device=rank)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for step in range(5):
    x = torch.randn(8, 10).cuda(rank, non_blocking=True) * (rank + 1)
    target = torch.arange(8).remainder(3).cuda(rank)
    loss = nn.functional.cross_entropy(model(x), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize(rank)
report(list(model.module.parameters()), loss=float(loss))
dist.destroy_process_group()
