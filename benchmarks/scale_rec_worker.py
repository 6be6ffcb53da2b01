"""The program ``benchmarks/scale_record.py`` records: a start-up as a scaletrain user's job does it.

``scaletrain.init()``, DDP through ``setup()``, a Monitor exchanging every 5 steps, a
Checkpointer (its stop agreement and its first save, which makes the checkpoint's process
group), ten steps, ``shutdown()``. Run on the CPU with gloo: what every rank asks of the store.
"""

import sys

import torch

import scaletrain
from scaletrain.observe.monitor import Monitor

env = scaletrain.init()
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = scaletrain.setup(model, opt, strategy="ddp")
monitor = Monitor(None, every=5, console=False)
ckpt = scaletrain.Checkpointer(sys.argv[1], keep=1)
for step in range(1, 11):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    monitor.step(samples=4, loss=loss)
    ckpt.step(step, {"model": model, "optimizer": opt})
ckpt.save(10, {"model": model, "optimizer": opt})
monitor.close()
ckpt.close()
scaletrain.shutdown()
