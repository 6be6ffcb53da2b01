"""Worker for the crash-safety test: save checkpoints in a loop until SIGKILLed.

Every tensor of step ``s`` (parameters, Adam's state) is filled with the value ``s`` and the
plain value ``"step"`` is ``s``, so a loaded checkpoint proves it is whole: everything must
equal the step its marker names.

Two modes:

- ``--dir D`` (``--strategy zero3`` under ``scaletrain run --nproc-per-node 2``): print
  ``ready <pid>`` after the first commit, then save steps 2, 3, ... until killed.
- ``--trials K --root R --out result.json`` (one plain process): K times, fork a child that
  saves in a loop, SIGKILL it after a random delay (seeded), then load the latest
  checkpoint in this process and check it; torch is imported once, so 24 trials are cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
import warnings
from pathlib import Path

import torch

import scaletrain
from scaletrain.checkpoint import layout


def objects(strategy: str, width: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if strategy != "none":
        model, opt = scaletrain.setup(model, opt, strategy=strategy)
    model(torch.randn(2, width)).sum().backward()
    opt.step()  # Adam now has state to save
    return model, opt


@torch.no_grad()
def fill(model, opt, value: float) -> None:
    for p in model.parameters():
        (p.to_local() if hasattr(p, "to_local") else p).fill_(value)
    for s in opt.state.values():
        for k, v in s.items():
            if k != "step":
                (v.to_local() if hasattr(v, "to_local") else v).fill_(value)


def save_forever(directory: str, strategy: str, width: int, ready_fd: int | None = None) -> None:
    model, opt = objects(strategy, width)
    ckpt = scaletrain.Checkpointer(directory, keep=2)
    state = {"model": model, "optimizer": opt, "step": 0}
    step = ckpt.latest_step or 0
    while True:
        step += 1
        fill(model, opt, float(step))
        state["step"] = step
        ckpt.save(step, state)
        if step == 1:
            if ready_fd is not None:
                os.write(ready_fd, b"r")
            else:
                print(f"ready {os.getpid()}", flush=True)


def verify(directory: Path, width: int) -> dict:
    """Load the latest checkpoint into fresh objects; report what was found."""
    latest = layout.highest_committed(directory)
    if latest is None:
        return {"ok": False, "why": "no committed checkpoint"}
    model, opt = objects("none", width)
    state = {"model": model, "optimizer": opt, "step": -1}
    ckpt = scaletrain.Checkpointer(directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a 2-rank checkpoint in 1 process: RNG not restored
        step = ckpt.load_latest(state)
    ckpt.close()
    whole = all(bool(torch.all(p == float(step))) for p in model.parameters()) and all(
        bool(torch.all(s[k] == float(step))) for s in opt.state.values()
        for k in ("exp_avg", "exp_avg_sq"))
    partial = [n for n in os.listdir(directory) if n.startswith(".partial-")]
    return {"ok": bool(step == latest.step == state["step"] and whole and not partial),
            "step": step, "marker_step": latest.step, "value": state["step"], "whole": whole,
            "partial_left": partial}


def trials(root: Path, count: int, width: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    results = []
    for trial in range(count):
        directory = root / f"t{trial}"
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: save until killed
            os.close(read_fd)
            try:
                save_forever(str(directory), "none", width, ready_fd=write_fd)
            finally:
                os._exit(1)
        os.close(write_fd)
        ready = os.read(read_fd, 1)  # first checkpoint committed
        os.close(read_fd)
        delay = rng.uniform(0.0, 0.6)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        result = verify(directory, width) if ready else {"ok": False, "why": "child died"}
        results.append({"trial": trial, "delay": delay, **result})
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir")
    parser.add_argument("--strategy", default="none")
    parser.add_argument("--width", type=int, default=600)
    parser.add_argument("--trials", type=int, default=0)
    parser.add_argument("--root")
    parser.add_argument("--out")
    parser.add_argument("--seed", type=int, default=20261122)
    args = parser.parse_args()
    if args.trials:
        torch.set_num_threads(1)  # forked children must not inherit a busy thread pool
        results = trials(Path(args.root), args.trials, args.width, args.seed)
        Path(args.out).write_text(json.dumps(results, indent=1))
        return 0
    if args.strategy != "none":
        scaletrain.init()
    save_forever(args.dir, args.strategy, args.width)
    return 1


if __name__ == "__main__":
    sys.exit(main())
