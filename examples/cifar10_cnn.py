"""The seeds' CIFAR-10 CNN, data-parallel with scaletrain: the same file runs on 1 CPU, N CPU
processes, N GPUs or N Slurm nodes.

    python examples/cifar10_cnn.py                                  # one process
    scaletrain run --nproc-per-node 2 examples/cifar10_cnn.py       # two processes (gloo on CPU)

No downloads are possible on the machines this runs on, so the data is synthetic but
CIFAR-shaped and learnable: 3x32x32 images from a fixed seed, labelled by a fixed random
linear map of their coarse colour pattern, so the loss visibly falls. Every rank builds the same dataset;
the DistributedSampler gives each rank its own share of it.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import scaletrain


class Net(nn.Module):
    """The CNN from the seeds (Alliance Canada's cifar10 examples)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def synthetic_cifar(samples: int, seed: int) -> TensorDataset:
    """CIFAR-shaped images with labels from a fixed linear map: learnable, identical on every rank.

    Each image is a smooth 4x4 colour pattern blown up to 32x32 plus pixel noise; its label is
    the arg-max of a fixed random linear map of that pattern. Pure pixel noise labelled the
    same way would be learnable in principle, but not by this small pooled CNN in a few epochs.
    """
    gen = torch.Generator().manual_seed(seed)
    coarse = torch.randn(samples, 3, 4, 4, generator=gen)
    images = F.interpolate(coarse, scale_factor=8, mode="bilinear", align_corners=False)
    images = images + 0.5 * torch.randn(samples, 3, 32, 32, generator=gen)
    labeller = torch.randn(3 * 4 * 4, 10, generator=gen)
    labels = (coarse.flatten(1) @ labeller).argmax(dim=1)
    return TensorDataset(images, labels)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--samples", type=int, default=4096, help="size of the synthetic dataset")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-params", metavar="DIR", default=None,
                   help="each rank writes its final parameters to DIR/params_rank<R>.pt")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    env = scaletrain.init()  # rank, device and backend from torchrun/Slurm/MPI, or rank 0 of 1
    device = torch.device(env.device)
    scaletrain.print(f"scaletrain: {env.describe()}")

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = Net().to(device)
    if env.distributed:
        # device_ids only for a GPU; on the CPU DDP takes none.
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    dataset = synthetic_cifar(args.samples, args.seed)
    sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        pin_memory=device.type == "cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        model.train()
        start = time.perf_counter()
        total = torch.zeros(2, device=device)  # [sum of losses, batches]
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach(), torch.ones((), device=device)])
        if env.distributed:
            torch.distributed.all_reduce(total)  # mean loss over every rank's batches
        elapsed = time.perf_counter() - start
        steps = len(loader)
        rate = steps * args.batch_size * env.world_size / max(elapsed, 1e-9)
        mean_loss = (total[0] / total[1].clamp(min=1)).item()
        scaletrain.print(f"epoch {epoch + 1}/{args.epochs} loss {mean_loss:.4f} "
                         f"samples/s {rate:.0f} ({steps} steps x {args.batch_size} x "
                         f"{env.world_size} processes)")

    if args.save_params:
        os.makedirs(args.save_params, exist_ok=True)
        inner = model.module if isinstance(model, DDP) else model
        state = {k: v.detach().cpu() for k, v in inner.state_dict().items()}
        torch.save(state, os.path.join(args.save_params, f"params_rank{env.rank}.pt"))
    scaletrain.shutdown()


if __name__ == "__main__":
    main()
