"""Monitor overhead per step: the same training loop with and without ``Monitor.step``.

    python benchmarks/monitor_overhead.py [--rounds 60] [--steps 400] [--repeats 1]

Two workloads, one process, one training thread: ``tiny`` (a 64-64-1 MLP on 16 samples, the
smallest step worth monitoring) and ``cnn`` (the bench scaling CNN, batch 32). The monitor
runs with its defaults (JSONL sink on, console off, hand-over to the writer thread every
second, cross-rank exchange every 100 steps, device sampler "auto"). Three figures:

- paired wall time: blocks of ``--steps`` steps alternate without and with the monitor (the
  order flips every round), so a change in machine load hits both alike; per round
  (with - without) / without; median and interquartile range over the rounds;
- paired CPU time of the process (all its threads, the monitor's writer included), the same way;
- the monitor's own CPU time per step: the training thread's CPU time inside ``Monitor.step``
  (its exchanges and hand-overs included; timed with ``thread_time`` in separate blocks, the
  median of the blocks' means, less the same timing of a call that does nothing, which is
  about 2 us here: the clock is a system call) plus the writer thread's CPU time (its own
  counter), against the CPU time of a step without the monitor. CPU time does not count other
  processes' turns, so this figure moves least with machine load.

Five more rows of the tiny MLP show what the JSONL lines cost: ``jsonl_every=1`` (a line per
step, the default before lines were spaced by time), ``jsonl_every=10`` (every tenth step) and
``jsonl=False`` (console and summary only), and what the paired differences read for a monitor
whose ``step`` does nothing (the benchmark's own bias: a Python call and the block order) and
for one that only reads the clock and keeps the reading (the least any step monitor does).

``--repeats N`` runs the whole measurement N times in fresh processes and prints every run.
Prints a markdown table per run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


# the rows that fix jsonl_every; the others keep the default (lines spaced ~10 ms apart)
_JSONL_EVERY = {"1": 1, "10": 10}


class _Null:
    """A monitor that does nothing: the cost of the call and of timing it (its row is the
    benchmark's own bias: the paired differences a call into Python shows without any work)."""

    _step = 0
    _writer = None

    def step(self, **_: Any) -> None:
        pass

    def close(self) -> None:
        pass


class _ClockOnly(_Null):
    """The least a step monitor can do: read the clock and keep the reading (bounded)."""

    def __init__(self) -> None:
        self._ends: list[float] = []

    def step(self, **_: Any) -> None:
        self._ends.append(time.perf_counter())
        if len(self._ends) > 100_000:
            self._ends = []


def _iqr(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def measure(rounds: int, steps: int) -> None:
    import torch

    torch.set_num_threads(1)
    from scaletrain.bench.workloads import build
    from scaletrain.observe.monitor import Monitor

    torch.manual_seed(0)
    tiny = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    x = torch.randn(16, 64)
    cnn = build("cnn", device="cpu")
    cases = {
        "tiny MLP (16 x 64)": (tiny, lambda i: tiny(x).pow(2).mean(), 16, steps),
        "tiny MLP, jsonl_every=1": (tiny, lambda i: tiny(x).pow(2).mean(), 16, steps),
        "tiny MLP, jsonl_every=10": (tiny, lambda i: tiny(x).pow(2).mean(), 16, steps),
        "tiny MLP, jsonl=False": (tiny, lambda i: tiny(x).pow(2).mean(), 16, steps),
        "tiny MLP, a monitor that does nothing": (tiny, lambda i: tiny(x).pow(2).mean(), 16, steps),
        "tiny MLP, a monitor that only keeps the clock": (tiny, lambda i: tiny(x).pow(2).mean(), 16, steps),
        "CNN (bench 'cnn', batch 32)": (cnn.model, lambda i: cnn.loss(cnn.model, cnn.make_batch(32, i)), 32,
                                        max(5, steps // 40)),
    }
    print("| workload | step without (ms, wall) | paired wall difference: median [IQR] "
          "| paired process CPU difference: median [IQR] | monitor CPU per step (us): step path + writer "
          "| monitor CPU / step CPU |")
    print("|---|---|---|---|---|---|")
    for name, (model, loss_of, batch, n) in cases.items():
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def block(monitor: Any, timed: bool = False) -> tuple[float, float, float]:
            inside = 0.0
            cpu0, t0 = time.process_time(), time.perf_counter()
            for i in range(n):
                loss = loss_of(i)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if monitor is not None:
                    if timed:
                        t1 = time.thread_time()  # this thread's CPU: other processes' turns do not count
                        monitor.step(samples=batch, loss=loss)
                        inside += time.thread_time() - t1
                    else:
                        monitor.step(samples=batch, loss=loss)
            return (time.perf_counter() - t0) / n, (time.process_time() - cpu0) / n, inside / n

        with tempfile.TemporaryDirectory() as tmp:
            # the defaults; console off (a benchmark's output), and the JSONL file where asked
            monitor: Any = _Null() if "does nothing" in name else _ClockOnly() if "only keeps" in name else \
                Monitor(tmp, console=False, device_sampler="auto", jsonl="jsonl=False" not in name,
                        jsonl_every=_JSONL_EVERY.get(name.rpartition("jsonl_every=")[2]))
            block(None), block(monitor)  # warm-up
            wall, cpu, base_wall, base_cpu = [], [], [], []
            for r in range(rounds):
                order = (None, monitor) if r % 2 == 0 else (monitor, None)
                got = {id(m): block(m) for m in order}
                (aw, ac, _), (bw, bc, _) = got[id(None)], got[id(monitor)]
                base_wall.append(aw)
                base_cpu.append(ac)
                wall.append((bw - aw) / aw)
                cpu.append((bc - ac) / ac)
            null_monitor, ins, nul = _Null(), [], []
            for r in range(max(6, rounds // 3)):  # interleaved, as above
                order = (monitor, null_monitor) if r % 2 == 0 else (null_monitor, monitor)
                got = {id(m): block(m, timed=True)[2] for m in order}
                ins.append(got[id(monitor)])
                nul.append(got[id(null_monitor)])
            inside, null = statistics.median(ins), statistics.median(nul)
            monitor_steps = monitor._step
            monitor.close()
            writer_cpu = getattr(monitor._writer, "cpu_s", None)  # None: a version without the counter
            writer = writer_cpu / monitor_steps if writer_cpu is not None else (0.0 if monitor._writer is None else None)
        inside = max(0.0, inside - null)  # less the call and the clock reads themselves
        step_cpu = statistics.median(base_cpu)
        (wl, wh), (cl, ch) = _iqr(wall), _iqr(cpu)
        print(f"| {name} | {statistics.median(base_wall) * 1000:.3f} "
              f"| {statistics.median(wall) * 100:+.2f}% [{wl * 100:+.2f}, {wh * 100:+.2f}] "
              f"| {statistics.median(cpu) * 100:+.2f}% [{cl * 100:+.2f}, {ch * 100:+.2f}] "
              + (f"| {inside * 1e6:.2f} + {writer * 1e6:.2f} | {(inside + writer) / step_cpu * 100:.2f}% |"
                 if writer is not None else f"| {inside * 1e6:.2f} + n/a | {inside / step_cpu * 100:.2f}% + writer |"))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n{rounds} rounds x {steps} steps per block (CNN: {max(5, steps // 40)}), 1 training thread, "
          f"{cores} cores, load average {load:.1f}, torch {torch.__version__}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--repeats", type=int, default=1, help="fresh processes, one table each")
    args = p.parse_args()
    if args.repeats == 1:
        measure(args.rounds, args.steps)
        return
    for i in range(args.repeats):
        print(f"\nrun {i + 1} of {args.repeats}", flush=True)
        subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds), "--steps", str(args.steps)],
                       check=True, timeout=3600)


if __name__ == "__main__":
    main()
