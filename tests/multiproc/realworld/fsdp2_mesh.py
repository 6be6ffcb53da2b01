"""FSDP2 (`fully_shard`) on a 1-D `DeviceMesh("cuda", ...)`, as the PyTorch FSDP2 tutorial builds it."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from agree import report

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(4):
    x = torch.randn(4, 8, device="cuda") + dist.get_rank()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
full = [p.full_tensor() for p in model.parameters()]
report(full, mesh=mesh.device_type, local=str(next(model.parameters()).to_local().device))
dist.destroy_process_group()
