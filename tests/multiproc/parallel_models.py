"""Tiny models shared by the parallel-strategy workers: the CIFAR CNN and a transformer block."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn


# The CNN and the transformer block are the examples' own classes, so the tests train
# exactly what users run.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from cifar10_cnn import Net as CifarCNN  # noqa: E402
from strategies_gpt import Block  # noqa: E402


class TinyTransformer(nn.Module):
    """Input projection, one transformer block, mean-pooled classifier head (10 classes)."""

    def __init__(self, dim: int = 32, heads: int = 4, in_dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(in_dim, dim)
        self.block = Block(dim, heads)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(x)).mean(dim=1))


MODELS = {"cnn": CifarCNN, "transformer": TinyTransformer}
INPUT_SHAPES = {"cnn": (3, 32, 32), "transformer": (8, 16)}


def make_data(model: str, steps: int, global_batch: int, seed: int = 1234):
    """``steps`` global batches (inputs, labels), identical on every process."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, global_batch, *INPUT_SHAPES[model], generator=g)
    y = torch.randint(0, 10, (steps, global_batch), generator=g)
    return x, y


def make_optimizer(kind: str, model: nn.Module):
    """Two param groups (matrices with weight decay, vectors without, a different lr), so a
    strategy that rebuilds the optimizer must keep per-group hyper-parameters to match."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    if kind == "sgd":
        return torch.optim.SGD([{"params": decay, "weight_decay": 1e-2},
                                {"params": other, "lr": 0.02}], lr=0.05, momentum=0.9)
    if kind == "adam":
        # eps=1e-6, not 1e-8: Adam divides each gradient element by its own running
        # magnitude, so fp32 summation-order noise (one batch of 64 vs. two of 32) in small
        # elements grows to ~8e-5 after 5 steps with eps=1e-8; at 1e-6 it stays ~3e-6.
        return torch.optim.Adam([{"params": decay, "weight_decay": 1e-2},
                                 {"params": other, "lr": 5e-4}], lr=1e-3, eps=1e-6)
    raise ValueError(kind)
