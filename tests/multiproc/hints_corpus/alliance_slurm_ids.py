"""The shape of the Alliance guide's DDP program (pytorch-ddp-test.py): each process computes its
rank from SLURM_LOCALID and SLURM_NODEID with ``int(os.environ.get(...))`` before
``init_process_group(init_method=tcp://...)``, and trains a small CNN on the GPU of its local
rank. Written for ``srun python ...``; run plainly it misses srun's variables."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="cifar10-like classification, distributed data parallel")
parser.add_argument("--lr", default=0.1, type=float)
parser.add_argument("--init_method", default="tcp://127.0.0.1:3456", type=str)
parser.add_argument("--dist-backend", default="nccl", type=str)
parser.add_argument("--world_size", default=1, type=int)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.fc1 = nn.Linear(6 * 28 * 28, 10)

    def forward(self, x):
        return self.fc1(F.relu(self.conv1(x)).flatten(1))


def main():
    print("Starting...")
    args = parser.parse_args()
    ngpus_per_node = torch.cuda.device_count()
    local_rank = int(os.environ.get("SLURM_LOCALID"))
    rank = int(os.environ.get("SLURM_NODEID")) * ngpus_per_node + local_rank
    torch.cuda.set_device(local_rank)
    print(f"From Rank: {rank}, ==> Initializing Process Group...")
    dist.init_process_group(backend=args.dist_backend, init_method=args.init_method,
                            world_size=args.world_size, rank=rank)
    net = nn.parallel.DistributedDataParallel(Net().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    for _ in range(2):
        optimizer.zero_grad()
        net(torch.randn(4, 3, 32, 32).cuda()).sum().backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
