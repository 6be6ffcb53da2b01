"""The shape of a centre course's DDP exercise: ``init_process_group`` first (env://, as under
torchrun or srun with MASTER_ADDR exported), then the device from ``os.environ["SLURM_LOCALID"]``.
After ``init_process_group`` torch writes every line of a traceback as ``[rank0]: ...``."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn


def setup():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["SLURM_LOCALID"])
    torch.cuda.set_device(local_rank)
    return local_rank


def main():
    local_rank = setup()
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2).cuda(), device_ids=[local_rank])
    model(torch.randn(4, 8).cuda()).sum().backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
