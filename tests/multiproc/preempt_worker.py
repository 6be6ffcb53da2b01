"""Worker for tests/multiproc/test_preempt_multiproc.py: a DDP loop that polls the stop agreement.

Usage: python preempt_worker.py OUT_DIR [--kill RANK:STEP:SIG ...] [--steps N] [--sleep S]
       [--period P]   (StopAgreement's period_s; default 0 = agree at every step)

Each step trains a tiny DDP model (real gradient all-reduces interleaved with the agreement's
own), then may send SIG to itself (``--kill 0:3:USR1`` = rank 0 after step 3), then polls.
``--flags RANK:STEP:BITS`` passes flag bits at that step. OUT_DIR/ready.<rank> appears after
step 2 so a test can signal from outside. On an agreed stop: OUT_DIR/rank<N>.json records the
step, rank 0 writes stop.json, and the process exits with EXIT_STOPPED. Without a stop it
records ``{"finished": N}`` and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

import scaletrain
from scaletrain.checkpoint.stoprecord import write_stop_record
from scaletrain.contract.environ import EXIT_STOPPED
from scaletrain.runtime import preempt
from scaletrain.runtime.agreement import StopAgreement

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--kill", action="append", default=[])
parser.add_argument("--flags", action="append", default=[])
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--period", type=float, default=0.0)  # 0: agree at every step
args = parser.parse_args()

env = scaletrain.init()
kills = {}
for item in args.kill:
    rank, step, sig = item.split(":")
    if int(rank) == env.rank:
        kills[int(step)] = getattr(signal, "SIG" + sig)
flags_at = {}
for item in args.flags:
    rank, step, bits = item.split(":")
    if int(rank) == env.rank:
        flags_at[int(step)] = int(bits)

torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
agreement = StopAgreement(period_s=args.period)
seen: list = []
record: dict = {"rank": env.rank}
for step in range(1, args.steps + 1):
    x = torch.randn(16, 8) + env.rank
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 2:
        (args.out / f"ready.{env.rank}").write_text(str(os.getpid()))
    if step in kills:
        os.kill(os.getpid(), kills[step])
        record["signalled_at"] = step
    reason, flags = agreement.poll(flags_at.get(step, 0))
    seen.append([step, reason, flags])
    if reason is not None:
        record.update(stopped_at=step, reason=reason, local=preempt.requested(), seen=seen,
                      signal=preempt.requested_by())
        (args.out / f"rank{env.rank}.json").write_text(json.dumps(record))
        if env.rank == 0:
            write_stop_record(args.out, reason=reason, step=step)
        agreement.close()
        sys.exit(EXIT_STOPPED)
    if args.sleep:
        time.sleep(args.sleep)
record.update(finished=args.steps, seen=seen, local=preempt.requested())
(args.out / f"rank{env.rank}.json").write_text(json.dumps(record))
agreement.close()
