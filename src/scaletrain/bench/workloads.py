"""Built-in workloads on synthetic data for ``scaletrain bench scaling``.

Small enough to run on CPU workers, shaped like the real thing: ``cnn`` (a few conv layers on
32x32 images), ``resnet`` (a ResNet-20-style network of residual blocks, CIFAR-sized) and
``gpt`` (a tiny decoder-only transformer on random tokens). Data are generated once per rank
from a seed and kept in memory, so the loader never limits the benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

WORKLOADS = ("cnn", "resnet", "gpt")


@dataclass
class Workload:
    """A model, a batch maker and a loss."""

    name: str
    model: Any
    make_batch: Callable[[int, int], Any]          # (batch size, index) -> batch on the device
    loss: Callable[[Any, Any], Any]                # (model, batch) -> scalar loss
    tokens_per_sample: int = 0


def build(name: str, *, device: Any, seed: int = 0) -> Workload:
    """The workload ``name`` with its model on ``device``."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(seed)
    if name == "cnn":
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(64, 10))
        return Workload(name, model.to(device), _images(device, seed), _classify)
    if name == "resnet":
        return Workload(name, _resnet20().to(device), _images(device, seed), _classify)
    if name == "gpt":
        vocab, seq = 256, 64
        model = _TinyGPT(vocab=vocab, seq=seq).to(device)

        def batch(size: int, index: int) -> Any:
            g = torch.Generator().manual_seed(seed * 100_003 + index % 16)
            return torch.randint(0, vocab, (size, seq + 1), generator=g).to(device)

        def loss(m: Any, tokens: Any) -> Any:
            logits = m(tokens[:, :-1])
            return F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))

        return Workload(name, model, batch, loss, tokens_per_sample=seq)
    from scaletrain.errors import UsageError

    raise UsageError(f"unknown workload {name!r}", f"use one of: {', '.join(WORKLOADS)}")


def _images(device: Any, seed: int) -> Callable[[int, int], Any]:
    import torch

    cache: dict[int, Any] = {}

    def batch(size: int, index: int) -> Any:
        key = index % 16  # 16 distinct batches, reused: data generation stays off the step path
        if key not in cache:
            g = torch.Generator().manual_seed(seed * 100_003 + key)
            cache[key] = (torch.randn(size, 3, 32, 32, generator=g).to(device),
                          torch.randint(0, 10, (size,), generator=g).to(device))
        return cache[key]

    return batch


def _classify(model: Any, batch: Any) -> Any:
    import torch.nn.functional as F

    x, y = batch
    return F.cross_entropy(model(x), y)


def _resnet20() -> Any:
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                          if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x: Any) -> Any:
            out = self.b1(self.c1(x)).relu()
            return (self.b2(self.c2(out)) + self.short(x)).relu()

    layers: list[Any] = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(Block(cin, cout, stride if i == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def _tiny_gpt_layer(dim: int, heads: int) -> Any:
    from torch import nn

    return nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)




def _make_tiny_gpt() -> type:
    import torch
    from torch import nn

    class TinyGPT(nn.Module):
        def __init__(self, vocab: int, seq: int, dim: int = 128, layers: int = 2, heads: int = 4) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.pos = nn.Parameter(torch.zeros(seq, dim))
            self.blocks = nn.ModuleList(_tiny_gpt_layer(dim, heads) for _ in range(layers))
            self.head = nn.Linear(dim, vocab)
            self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

        def forward(self, tokens: Any) -> Any:
            n = tokens.shape[1]
            x = self.embed(tokens) + self.pos[:n]
            for block in self.blocks:
                mask = self.get_buffer("mask")
                x = block(x, src_mask=mask[:n, :n], is_causal=True)
            return self.head(x)

    return TinyGPT


def _TinyGPT(**kwargs: Any) -> Any:  # noqa: N802 - builds the class on first use (torch stays lazy)
    return _make_tiny_gpt()(**kwargs)
