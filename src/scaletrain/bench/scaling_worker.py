"""Worker of ``scaletrain bench scaling``: trains a built-in workload for a few steps at one size.

    scaletrain run --nproc-per-node N -m scaletrain.bench.scaling_worker --workload cnn --steps 20 --out r.json

Every rank trains with a :class:`~scaletrain.observe.monitor.Monitor` on; rank 0 writes one
JSON row: the median step time after warm-up, global and per-device throughput, data wait,
gradient bytes, and (on more than one rank) the all-reduce bus bandwidth at the gradient size,
measured after training so that it does not disturb the steps.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from scaletrain.fileio import atomic_write, json_text


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scaletrain.bench.scaling_worker", allow_abbrev=False)
    p.add_argument("--workload", default="cnn")
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--mode", choices=("weak", "strong"), default="weak")
    p.add_argument("--batch", type=int, default=32, help="per device (weak) or global (strong)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--run-dir", default=None)
    return p.parse_args(argv)


def _allreduce_busbw(nbytes: int, device: str) -> float | None:
    from scaletrain.bench.comm import measure

    return measure("all_reduce", max(4096, nbytes), iters=5, warmup=2, device=device).busbw_gbs


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    import torch

    import scaletrain
    from scaletrain.bench.workloads import build
    from scaletrain.observe.monitor import Monitor

    env = scaletrain.init()
    if args.mode == "weak":
        per_device = args.batch
    else:
        per_device = max(1, args.batch // env.world_size)
    work = build(args.workload, device=env.device, seed=1234 + env.rank)
    opt = torch.optim.SGD(work.model.parameters(), lr=0.01, momentum=0.9)
    model, opt = scaletrain.setup(work.model, opt, strategy=args.strategy)
    grad_bytes = sum(p.numel() * p.element_size() for p in work.model.parameters() if p.requires_grad)
    monitor = Monitor(args.run_dir, console=False, every=max(1, args.steps), warmup=args.warmup,
                      device_sampler="auto")
    monitor.start()
    for i in range(args.steps):
        batch = work.make_batch(per_device, i)
        loss = work.loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if env.device.startswith("cuda"):
            torch.cuda.synchronize()  # step times per step, not per queue
        monitor.step(samples=per_device, tokens=per_device * work.tokens_per_sample or None, loss=loss)
    summary = monitor.close()
    busbw = _allreduce_busbw(grad_bytes, env.device) if env.world_size > 1 else None
    if env.rank == 0:
        row = {"nproc": env.world_size, "nodes": env.num_nodes, "workload": args.workload,
               "strategy": args.strategy, "mode": args.mode, "batch_per_device": per_device,
               "steps": args.steps, "warmup": args.warmup, "device": env.device, "backend": env.backend,
               "step_s": summary["step_s_median"], "step_s_mean": summary["step_s_mean"],
               "samples_per_s": summary["samples_per_s"],
               "samples_per_s_per_device": summary["samples_per_s"] / env.world_size,
               "data_wait_frac": summary["data_wait_frac"], "grad_bytes": grad_bytes,
               "allreduce_busbw_gbs": busbw, "peak_mem_gb": summary["peak_mem_gb"],
               "threads": torch.get_num_threads(), "time": time.time(), "torch": torch.__version__}
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, json_text(row, indent=2) + "\n")
    scaletrain.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
