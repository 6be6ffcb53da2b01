"""Per-step cost of the stop agreement (``StopAgreement.poll``) on 2 ranks.

    python benchmarks/stop_agreement.py [--pairs 40] [--steps 50] [--nproc 2]

Starts itself under ``scaletrain run``. Each worker trains two models with DDP on the CPU: a
tiny MLP (the worst case: a step of well under a millisecond) and the CIFAR-10 CNN of
examples/cifar10_cnn.py (batch 32 per rank). For each model, blocks of ``--steps`` training steps
alternate between "with ``poll()`` once per step" and "without", ``--pairs`` times (ABAB...,
which block goes first alternates too), so a change in machine load hits both alike. Rank 0
prints a markdown table: the median step time of each, the median over pairs of the
per-pair overhead (with / without - 1), the share of the step spent inside ``poll()`` (the
host-side cost, which machine load does not blur), and the sync interval the agreement chose.
Target: below 1% of the step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _drive(args: argparse.Namespace) -> int:
    env = {k: v for k, v in os.environ.items()
           if k not in {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(REPO / "src"), str(REPO / "examples"), env.get("PYTHONPATH", "")] if p)
    cmd = [sys.executable, "-m", "scaletrain", "run", "--nproc-per-node", str(args.nproc),
           __file__, "--worker", "--pairs", str(args.pairs), "--steps", str(args.steps)]
    return subprocess.run(cmd, env=env, timeout=3600).returncode


def _models():
    import torch
    from cifar10_cnn import Net

    tiny = (torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)),
            lambda g: (torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)))
    cnn = (Net(), lambda g: (torch.randn(32, 3, 32, 32, generator=g),
                             torch.randint(0, 10, (32,), generator=g)))
    return {"tiny MLP (batch 16)": tiny, "CIFAR-10 CNN (batch 32)": cnn}


def _work(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import scaletrain
    from scaletrain.runtime.agreement import StopAgreement

    env = scaletrain.init()
    rows = []
    for name, (net, make) in _models().items():
        torch.manual_seed(0)
        model, opt = scaletrain.setup(net, torch.optim.SGD(net.parameters(), lr=0.01),
                                      strategy="ddp")
        g = torch.Generator().manual_seed(env.rank)
        x, y = make(g)
        agreement = StopAgreement()

        in_poll = [0.0]

        def block(poll: bool) -> float:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if poll:
                    t0 = time.perf_counter()
                    agreement.poll()
                    in_poll[0] += time.perf_counter() - t0
            return (time.perf_counter() - start) / args.steps

        block(True), block(False)  # warm-up: allocator, gloo buffers
        in_poll[0] = 0.0
        with_s, without_s, ratios = [], [], []
        for i in range(args.pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            times = {poll: block(poll) for poll in order}
            with_s.append(times[True])
            without_s.append(times[False])
            ratios.append(times[True] / times[False] - 1)
        agreement.close()
        rows.append((name, statistics.median(without_s), statistics.median(with_s),
                     statistics.median(ratios), statistics.quantiles(ratios, n=4),
                     in_poll[0] / sum(with_s) / args.steps, agreement.interval))
    if env.rank == 0:
        print(f"\n{args.pairs} pairs x {args.steps} steps, {env.world_size} ranks, gloo, "
              f"{torch.get_num_threads()} thread(s) per rank, torch {torch.__version__}\n")
        print("| model | step without (ms) | step with poll() (ms) | overhead (median of pairs) "
              "| quartiles of pairs | time inside poll() | sync interval (steps) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, base, polled, ratio, (q1, _, q3), inside, interval in rows:
            print(f"| {name} | {base * 1e3:.3f} | {polled * 1e3:.3f} | {ratio * 100:+.2f}% | "
                  f"{q1 * 100:+.2f}% .. {q3 * 100:+.2f}% | {inside * 100:.3f}% | {interval} |")
    scaletrain.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _work(args)
        return 0
    return _drive(args)


if __name__ == "__main__":
    sys.exit(main())
