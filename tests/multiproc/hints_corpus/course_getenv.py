"""The shape of a torchrun tutorial program (the LUMI workshop's env contract): LOCAL_RANK, RANK
and WORLD_SIZE read with ``int(os.getenv(...))``. Under ``--emulate slurm`` the program gets
srun's view, where torchrun's variables are not set."""

import os

import torch
import torch.distributed as dist


def main():
    local_rank = int(os.getenv("LOCAL_RANK"))
    rank = int(os.getenv("RANK"))
    world_size = int(os.getenv("WORLD_SIZE"))
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(local_rank)
    if rank == 0:
        print(f"training on {world_size} processes")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
