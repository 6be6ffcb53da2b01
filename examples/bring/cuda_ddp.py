"""A torchrun DDP program hard-coded for CUDA and NCCL, as people write them.

.cuda(), backend="nccl", device_ids=[local_rank], torch.load(map_location="cuda:0").
Under `scaletrain run --cpu` it trains on CPU processes; rank 0 can write a summary to argv[1].
"""

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group(backend="nccl")
torch.manual_seed(0)
model = DDP(nn.Linear(8, 2).cuda(), device_ids=[local_rank], output_device=local_rank)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(4, 8, device="cuda") + dist.get_rank()
    y = torch.zeros(4, 2).to("cuda", non_blocking=True)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
out = sys.argv[1] if len(sys.argv) > 1 else None
# every rank computes the same path: a temporary folder, named after the run's port
ckpt = os.path.join(tempfile.gettempdir(), f"cuda_ddp_{os.environ.get('MASTER_PORT', '0')}.pt")
if dist.get_rank() == 0:
    torch.save(model.module.state_dict(), ckpt)
dist.barrier()
state = torch.load(ckpt, map_location="cuda:0")
model.module.load_state_dict(state)
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, flat)
if dist.get_rank() == 0:
    print(f"backend {dist.get_backend()}, loss {float(loss):.4f}, parameters equal: "
          f"{all(torch.equal(g, gathered[0]) for g in gathered)}")
if dist.get_rank() == 0 and out:
    with open(out, "w") as fh:
        json.dump({"world": dist.get_world_size(), "backend": str(dist.get_backend()),
                   "device": str(flat.device), "loss": float(loss),
                   "params_equal": all(torch.equal(g, gathered[0]) for g in gathered),
                   "cuda_devices": torch.cuda.device_count()}, fh)
dist.barrier()
if dist.get_rank() == 0:
    os.remove(ckpt)
dist.destroy_process_group()
