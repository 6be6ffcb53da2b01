"""Worker for tests/multiproc/test_observe_multiproc.py: DDP with a Monitor; rank 1 is slowed.

Rank 1 waits ``--sleep`` seconds for each batch (a slow loader), so every rank's step takes as
long as rank 1's (they meet in the gradient all-reduce) and only the wait measured by
``Monitor.watch`` tells them apart. A fake device backend stands in for NVML: the node's GPU 0
busy, GPU 1 (local rank 1's) idle; only local rank 0 may run it. Each rank writes
``rank<N>.json`` with its sampler threads and what it was told about its device.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import torch

import scaletrain
from scaletrain.fileio import atomic_write
from scaletrain.observe.devices import THREAD_NAME, Sample
from scaletrain.observe.monitor import Monitor


class FakeBackend:
    """The node's two GPUs at fixed utilisations, counting its readings."""

    name = "fake"

    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> dict[str, Sample]:
        self.reads += 1
        return {"0": Sample(util_pct=95.0, mem_gb=2.0, power_w=300.0),
                "1": Sample(util_pct=10.0, mem_gb=1.0, power_w=80.0)}

    def close(self) -> None:
        pass


p = argparse.ArgumentParser()
p.add_argument("--run-dir", required=True)
p.add_argument("--slow-rank", type=int, default=1)
p.add_argument("--sleep", type=float, default=0.03)
p.add_argument("--steps", type=int, default=30)
args = p.parse_args()

env = scaletrain.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt = scaletrain.setup(model, opt, strategy="ddp")
backend = FakeBackend()
monitor = Monitor(args.run_dir, total_steps=args.steps, every=5, console=False, device_sampler=backend,
                  sample_interval_s=0.005,
                  device_id=str(env.local_rank), num_workers=1)
threads = sum(t.name == THREAD_NAME for t in threading.enumerate())
assert monitor.watch(model), "the model should be DDP-wrapped"
x = torch.randn(16, 64)


def batches():
    for _ in range(args.steps):
        if env.rank == args.slow_rank:
            time.sleep(args.sleep)
        yield x


for xb in monitor.data(batches()):
    loss = model(xb).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    monitor.step(samples=16, loss=loss)
summary = monitor.close()
atomic_write(Path(args.run_dir) / f"rank{env.rank}.json",
             json.dumps({"rank": env.rank, "local_rank": env.local_rank, "sampler_threads": threads,
                         "backend_reads": backend.reads, "device_util": summary["device_util"]}))
scaletrain.shutdown()
