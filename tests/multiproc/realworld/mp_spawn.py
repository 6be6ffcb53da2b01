"""The PyTorch DDP tutorial's own launcher: `mp.spawn` with a hard-coded address and port.

Run under a launcher that already starts 2 workers, it starts 2 more per worker, and both
copies try to meet at the same port.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

PORT = sys.argv[1] if len(sys.argv) > 1 else "12355"


def train(rank: int, world_size: int) -> None:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = PORT
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = nn.parallel.DistributedDataParallel(nn.Linear(2, 2))
    model(torch.randn(1, 2)).sum().backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(train, args=(2,), nprocs=2, join=True)
