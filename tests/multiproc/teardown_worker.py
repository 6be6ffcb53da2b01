"""A program shaped like the corpus one that hung in torch's gloo teardown: DDP over gloo, a
few steps, ``destroy_process_group()`` at the end. ``stuck``: rank 0 then blocks inside torch
(a store barrier no one else joins), as a rank deadlocked in its teardown does.

Usage: teardown_worker.py OUT_DIR clean|stuck
"""

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

out, mode = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(rank)
for _ in range(5):
    loss = model(torch.randn(4, 8, generator=generator)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
params = [p.detach().flatten().tolist() for p in model.parameters()]
with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
    json.dump(params, fh)
dist.destroy_process_group()
if mode == "stuck" and rank == 0:
    from torch.distributed.elastic.utils.store import barrier

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(hours=1))
    barrier(store, world_size=2, key_prefix="never", barrier_timeout=3600)
