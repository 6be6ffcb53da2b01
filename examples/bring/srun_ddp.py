"""A DDP program in the form of the Alliance's PyTorch guide: written for srun, CUDA and NCCL.

rank = SLURM_NODEID * GPUs per node + SLURM_LOCALID, init_method tcp://..., .cuda(), device_ids.
Runs unmodified under `scaletrain run --emulate slurm` (add `--cuda` for the guide's CUDA form and
`--cpu` to run that form on CPU processes); rank 0 can write what every rank saw to --out.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
# a batch script exports MASTER_ADDR/MASTER_PORT and passes --init_method tcp://$MASTER_ADDR:$MASTER_PORT
parser.add_argument("--init_method",
                    default=f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '3456')}")
parser.add_argument("--world_size", type=int, default=int(os.environ.get("SLURM_NTASKS", "1")))
parser.add_argument("--out", help="rank 0 writes what every rank saw here (JSON)")
parser.add_argument("--cuda", action="store_true", help="the guide's CUDA form")
args = parser.parse_args()

ngpus_per_node = torch.cuda.device_count() if args.cuda else int(os.environ["SLURM_NTASKS_PER_NODE"])
local_rank = int(os.environ.get("SLURM_LOCALID"))
rank = int(os.environ.get("SLURM_NODEID")) * ngpus_per_node + local_rank
backend = "nccl" if args.cuda else "gloo"
if args.cuda:
    torch.cuda.set_device(local_rank)
dist.init_process_group(backend=backend, init_method=args.init_method,
                        world_size=args.world_size, rank=rank)
torch.manual_seed(0)
net = nn.Linear(8, 4)
if args.cuda:
    net = net.cuda()
    model = DDP(net, device_ids=[local_rank])
else:
    model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(rank)
for _ in range(3):
    x = torch.randn(16, 8, generator=gen)
    if args.cuda:
        x = x.cuda()
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, flat)
seen = {k: os.environ.get(k) for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
                                        "SLURM_NTASKS", "SLURM_NNODES", "SLURM_JOB_NODELIST",
                                        "SLURM_TASKS_PER_NODE", "RANK", "WORLD_SIZE")}
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, {"rank": rank, "env": seen})
if rank == 0:
    print(f"world {dist.get_world_size()}, parameters equal on all ranks: "
          f"{all(torch.equal(g, gathered[0]) for g in gathered)}")
if rank == 0 and args.out:
    with open(args.out, "w") as fh:
        json.dump({"world": dist.get_world_size(),
                   "params_equal": all(torch.equal(g, gathered[0]) for g in gathered),
                   "ranks": everyone}, fh)
dist.destroy_process_group()
