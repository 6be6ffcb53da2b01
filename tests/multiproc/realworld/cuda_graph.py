"""A program that captures its step in a CUDA graph: there is nothing on the CPU to replay."""

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
static = torch.zeros(4, device="cuda")
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    static.add_(1)
graph.replay()
dist.destroy_process_group()
