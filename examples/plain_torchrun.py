"""A torchrun-style script with no scaletrain in it: `scaletrain run` starts it unchanged.

    scaletrain run --nproc-per-node 2 examples/plain_torchrun.py
    torchrun --standalone --nproc-per-node 2 examples/plain_torchrun.py    # the same thing

It reads the environment contract torchrun defines (the seeds' LUMI guide lists it:
WORLD_SIZE, RANK, LOCAL_WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), picks its device
by local rank, and checks an all_reduce.
"""

import os

import torch
import torch.distributed as dist


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        backend, device = "nccl", torch.device("cuda", local_rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend)  # env:// reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()

    value = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    print(f"rank {rank}/{world} (local {local_rank}/{os.environ['LOCAL_WORLD_SIZE']}) on {device}: "
          f"all_reduce sum {value.item():g} (expected {expected:g}), "
          f"{torch.get_num_threads()} CPU threads, master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
