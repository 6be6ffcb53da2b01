"""Tensor parallel on a device mesh named after the current accelerator (the TP tutorial's form)."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from agree import report

device_type = torch.accelerator.current_accelerator().type
torch.accelerator.set_device_index(int(os.environ["LOCAL_RANK"]))
dist.init_process_group()
tp_mesh = init_device_mesh(device_type, (int(os.environ["WORLD_SIZE"]),), mesh_dim_names=("tp",))
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(6, 16, bias=False), nn.ReLU(), nn.Linear(16, 6, bias=False))
mlp = parallelize_module(mlp, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
opt = torch.optim.SGD(mlp.parameters(), lr=0.1, foreach=False)
torch.manual_seed(1)  # the same input on every TP rank
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    for step in range(3):
        x = torch.randn(4, 6, device=device_type)
        loss = mlp(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
stream.synchronize()
torch.accelerator.synchronize()
full = [p.full_tensor() for p in mlp.parameters()]
report(full, device_type=device_type)
dist.destroy_process_group()
