"""The CSC machine-learning guide's DeepSpeed shape (seeds 000/001, docs.csc.fi ml-multi):
``deepspeed.add_config_arguments``, ``deepspeed.init_distributed()`` with no backend,
``deepspeed.initialize(args=, model=, model_parameters=, training_data=)`` giving the loader, and
batches moved with ``.to(model_engine.local_rank)`` (an integer: a GPU index). The config names
DeepSpeed's own Adam, which DeepSpeed builds as a fused CUDA op where it takes its CUDA accelerator.

argv: --deepspeed --deepspeed_config FILE ... OUT.json (written by rank 0: agree.report, plus the
accelerator DeepSpeed chose and the first and last loss)."""

import argparse

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator
from torch import nn

from agree import report

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--local_rank", type=int, default=-1)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

deepspeed.init_distributed()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
data = torch.Generator().manual_seed(1)
x = torch.randn(128, 8, generator=data)
train_dataset = torch.utils.data.TensorDataset(x, (x.sum(1) > 0).long())

model_engine, optimizer, train_loader, __ = deepspeed.initialize(
    args=args, model=model, model_parameters=model.parameters(), training_data=train_dataset)
criterion = nn.CrossEntropyLoss()

losses = []
for epoch in range(3):
    for batch in train_loader:
        data = batch[0].to(model_engine.local_rank)
        labels = batch[1].to(model_engine.local_rank)

        outputs = model_engine(data)
        loss = criterion(outputs, labels)

        model_engine.backward(loss)
        model_engine.step()
        losses.append(loss.item())

report(list(model_engine.module.parameters()), accelerator=get_accelerator().device_name(),
       optimizer=type(optimizer).__name__, first_loss=losses[0], last_loss=losses[-1], steps=len(losses))
model_engine.destroy()
deepspeed.comm.destroy_process_group()
