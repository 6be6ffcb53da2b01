"""Trains with or without a process group, as programs that look for GPUs do.

argv[1]: "skip" - no init_process_group without a GPU (each worker trains alone);
"early" - forms the group, then destroys it before training (not alone);
"one" - init_process_group with world_size=1 and rank 0 on its own store (alone).
argv[2] "crash" (optional): rank 1 fails after training; "crash-first": every rank fails
before it trains.
"""

import os

import sys

import torch
import torch.distributed as dist

mode = sys.argv[1]
if mode == "early":
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
elif mode == "one":
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
elif torch.cuda.is_available():
    dist.init_process_group("nccl")
if sys.argv[2:] == ["crash-first"]:
    raise RuntimeError("failed before training")
w = torch.zeros(3, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(3):
    opt.zero_grad()
    (w - 1).pow(2).sum().backward()
    opt.step()
if dist.is_initialized():
    dist.destroy_process_group()
if sys.argv[2:] == ["crash"] and os.environ.get("RANK") == "1":
    raise RuntimeError("failed after training alone")
