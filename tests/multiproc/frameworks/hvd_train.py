"""The Alliance PyTorch page's Horovod program shape (pytorch_horovod.py), in our own words and
small: ``hvd.init()``, the device from ``hvd.local_rank()``, a DistributedSampler over
``hvd.size()`` ranks, SGD with momentum wrapped in ``hvd.DistributedOptimizer``, and
``hvd.broadcast_parameters`` before training. CIFAR-10 is replaced by 128 random 32x32 images
(the guide's Net, as the README's example defines it), so it runs anywhere; on CPU when no GPU is visible.

argv: OUT_DIR [--batch_size B] [--max_epochs N]. Each rank writes OUT_DIR/hvd-<rank>.json: its
rank, Horovod's size and local rank, the controller (mpi or gloo), the flattened trained
parameters and the last loss."""

import argparse
import json
import os
import sys

import horovod.torch as hvd

import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data.distributed
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples"))
from cifar10_cnn import Net  # noqa: E402 - the Alliance guide's Net

parser = argparse.ArgumentParser(description='cifar10 classification models, horovod test')
parser.add_argument('out')
parser.add_argument('--lr', type=float, default=0.01, help='')
parser.add_argument('--batch_size', type=int, default=16, help='')
parser.add_argument('--max_epochs', type=int, default=2, help='')
parser.add_argument('--num_workers', type=int, default=0, help='')


def main():
    args = parser.parse_args()

    hvd.init()

    local_rank = hvd.local_rank()
    global_rank = hvd.rank()
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)

    torch.manual_seed(global_rank)   # different on each rank: broadcast_parameters must align them
    net = Net().to(device)

    data = torch.Generator().manual_seed(1)
    images = torch.randn(128, 3, 32, 32, generator=data)
    dataset_train = TensorDataset(images, torch.randint(0, 10, (128,), generator=data))
    train_sampler = torch.utils.data.distributed.DistributedSampler(dataset_train, num_replicas=hvd.size(),
                                                                    rank=global_rank)
    train_loader = DataLoader(dataset_train, batch_size=args.batch_size, shuffle=(train_sampler is None),
                              num_workers=args.num_workers, sampler=train_sampler)

    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)

    loss = None
    for epoch in range(args.max_epochs):
        train_sampler.set_epoch(epoch)
        for inputs, targets in train_loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = net(inputs)
            loss = criterion(outputs, targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    flat = torch.cat([p.detach().reshape(-1).double().cpu() for p in net.parameters()])
    with open(os.path.join(args.out, f"hvd-{global_rank}.json"), "w") as fh:
        json.dump({"rank": global_rank, "size": hvd.size(), "local_rank": local_rank,
                   "controller": "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else "?",
                   "params": flat.tolist(), "loss": loss.item()}, fh)


if __name__ == '__main__':
    main()
