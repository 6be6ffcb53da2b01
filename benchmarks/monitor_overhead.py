"""Monitor overhead per step: the same training loop with and without ``Monitor.step``.

    python benchmarks/monitor_overhead.py [--rounds 15] [--steps 100]

Two workloads, one process, one thread: ``tiny`` (a 64-64-1 MLP on 16 samples, the smallest
step worth monitoring) and ``cnn`` (the bench scaling CNN, batch 32). Blocks of ``--steps``
steps alternate, without and with the monitor (JSONL sink on, console off, a flush and an
aggregation every 100 steps, the default), so a change in machine load hits both alike; the overhead is the
median over rounds of (with - without) / without. Because that difference drowns in noise on
a busy machine once the step is long, the time spent inside ``Monitor.step`` itself (its
flushes included) is also summed and reported against the step time. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=100)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from scaletrain.bench.workloads import build
    from scaletrain.observe.monitor import Monitor

    tiny = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    x = torch.randn(16, 64)
    cnn = build("cnn", device="cpu")
    cases = {
        "tiny MLP (16 x 64)": (tiny, lambda i: tiny(x).pow(2).mean(), 16),
        "CNN (bench 'cnn', batch 32)": (cnn.model, lambda i: cnn.loss(cnn.model, cnn.make_batch(32, i)), 32),
    }
    print("| workload | step without (ms, wall) | step with (ms, wall) | paired difference (wall) "
          "| step CPU time (ms) | CPU time in Monitor.step (us/step) | Monitor.step / step (CPU) |")
    print("|---|---|---|---|---|---|---|")
    for name, (model, loss_of, batch) in cases.items():
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        inside = [0.0]
        cpu_without: list[float] = []
        steps = args.steps if "tiny" in name else max(5, args.steps // 5)

        def block(monitor: Monitor | None) -> float:
            cpu0 = time.thread_time()
            t0 = time.perf_counter()
            for i in range(steps):
                loss = loss_of(i)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if monitor is not None:
                    t1 = time.thread_time()  # CPU time of this thread: other processes do not count
                    monitor.step(samples=batch, loss=loss)
                    inside[0] += time.thread_time() - t1
            if monitor is None:
                cpu_without.append((time.thread_time() - cpu0) / steps)
            return (time.perf_counter() - t0) / steps

        with tempfile.TemporaryDirectory() as tmp:
            monitor = Monitor(tmp, console=False, device_sampler="auto")  # defaults: every=100
            block(None), block(monitor)  # warm-up
            inside[0] = 0.0
            ratios, without, with_ = [], [], []
            for r in range(args.rounds):
                order = (None, monitor) if r % 2 == 0 else (monitor, None)
                times = {id(m): block(m) for m in order}
                a, b = times[id(None)], times[id(monitor)]
                without.append(a)
                with_.append(b)
                ratios.append((b - a) / a)
            monitor.close()
        a, b = statistics.median(without), statistics.median(with_)
        # less the cost of the two clock reads themselves (measured, not assumed)
        c0 = time.thread_time()
        for _ in range(10000):
            time.thread_time()
        clock = (time.thread_time() - c0) / 10000
        cost = max(0.0, inside[0] / (args.rounds * steps) - clock)
        cpu_step = statistics.median(cpu_without)
        print(f"| {name} | {a * 1000:.3f} | {b * 1000:.3f} | {statistics.median(ratios) * 100:+.2f}% "
              f"| {cpu_step * 1000:.3f} | {cost * 1e6:.1f} | {cost / cpu_step * 100:.3f}% |")
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    print(f"\n{args.rounds} rounds x {args.steps} steps per block (CNN: {max(5, args.steps // 5)}), 1 thread, {cores} cores, torch {torch.__version__}")


if __name__ == "__main__":
    main()
