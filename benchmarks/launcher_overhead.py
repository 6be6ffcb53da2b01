"""Launcher overhead: `scaletrain run` against `torchrun --standalone` on the same trivial job.

    python benchmarks/launcher_overhead.py [--runs 7] [--nproc 2] [--compare-src OTHER/src]

The job: every worker initialises gloo, does one all_reduce and exits, so the wall time is
almost all launcher (start-up, rendezvous, process supervision, shutdown). The two launchers
alternate, run after run (the order rotating), so that a change in machine load hits both alike.
Prints a markdown table with the median wall time of each, and the ratio scaletrain / torchrun
both as the ratio of the medians and as the median of the per-run (paired) ratios (target:
<= 1.00). ``--compare-src`` adds a third arm: ``scaletrain run`` from another source tree (e.g.
the main branch's ``src``), for a before/after in the same run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TRIVIAL = """\
import os, time
started = time.time()
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
with open(os.environ["BENCH_STAMPS"], "a") as fh:
    fh.write(f"{started} {time.time()}\\n")
"""


def _env(src: Path = REPO / "src") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(src), env.get("PYTHONPATH", "")] if p)
    return env


def _time(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall, start-up, exit) seconds: the whole run; launcher start to the first worker's
    first line; the last worker's last line to the launcher's exit. The last two are the
    launcher's own share, which machine load (the workers' torch import) moves much less."""
    with tempfile.NamedTemporaryFile("r", suffix=".stamps") as stamps:
        start = time.time()
        proc = subprocess.run(cmd, env={**env, "BENCH_STAMPS": stamps.name}, capture_output=True,
                              text=True, timeout=300)
        end = time.time()
        if proc.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
        rows = [tuple(map(float, line.split())) for line in stamps.read().splitlines() if line.strip()]
    return end - start, min(r[0] for r in rows) - start, end - max(r[1] for r in rows)


def machine() -> str:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    import importlib.metadata as md

    return (f"{cores} cores ({platform.processor() or platform.machine()}), CPU only, "
            f"Python {platform.python_version()}, torch {md.version('torch')}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7, help="runs of each launcher (>= 5)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--compare-src", type=Path, help="another tree's src/ for a third arm (before/after)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "trivial.py"
        script.write_text(TRIVIAL)
        ours = [sys.executable, "-m", "scaletrain", "run", "--nproc-per-node", str(args.nproc), str(script)]
        launchers = {
            "scaletrain run": (ours, _env()),
            "torchrun --standalone": ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                       "--nproc-per-node", str(args.nproc), str(script)], _env()),
        }
        if args.compare_src:
            launchers[f"scaletrain run ({args.compare_src})"] = (ours, _env(args.compare_src.resolve()))
        for cmd, env in launchers.values():  # warm the file cache; not counted
            _time(cmd, env)
        names = list(launchers)
        times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in launchers}
        for run in range(args.runs):
            for name in names[run % len(names):] + names[:run % len(names)]:  # rotate who goes first
                cmd, env = launchers[name]
                times[name].append(_time(cmd, env))

    base = times["torchrun --standalone"]
    print(f"Machine: {machine()}; {args.nproc} workers, {args.runs} alternating runs each; "
          f"load average {os.getloadavg()[0]:.1f} at the end.\n")
    print("| launcher | wall: median [min, max] (s) | wall / torchrun: paired median | start-up (s) | "
          "exit (s) | start-up + exit / torchrun's: paired median |")
    print("|---|---|---|---|---|---|")
    for name, ts in times.items():
        wall = [t[0] for t in ts]
        paired = statistics.median(t[0] / b[0] for t, b in zip(ts, base))
        own = statistics.median((t[1] + t[2]) / (b[1] + b[2]) for t, b in zip(ts, base))
        print(f"| `{name}` | {statistics.median(wall):.3f} [{min(wall):.3f}, {max(wall):.3f}] | {paired:.3f} | "
              f"{statistics.median(t[1] for t in ts):.3f} | {statistics.median(t[2] for t in ts):.3f} | {own:.3f} |")
    print("\ntarget: scaletrain run / torchrun <= 1.00")


if __name__ == "__main__":
    main()
