"""Launcher overhead: `scaletrain run` against `torchrun --standalone` on the same trivial job.

    python benchmarks/launcher_overhead.py [--runs 7] [--nproc 2]

The job: every worker initialises gloo, does one all_reduce and exits, so the wall time is
almost all launcher (start-up, rendezvous, process supervision, shutdown). The two launchers
alternate, run after run, so that a change in machine load hits both alike. Prints a markdown
table with the median wall time of each and their ratio (target: scaletrain / torchrun <= 1.05).
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
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO / "src"), env.get("PYTHONPATH", "")] if p)
    return env


def _time(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return elapsed


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
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "trivial.py"
        script.write_text(TRIVIAL)
        launchers = {
            "scaletrain run": [sys.executable, "-m", "scaletrain", "run",
                               "--nproc-per-node", str(args.nproc), str(script)],
            "torchrun --standalone": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                      "--nproc-per-node", str(args.nproc), str(script)],
        }
        env = _env()
        for cmd in launchers.values():  # warm the file cache; not counted
            _time(cmd, env)
        times: dict[str, list[float]] = {name: [] for name in launchers}
        for _ in range(args.runs):
            for name, cmd in launchers.items():
                times[name].append(_time(cmd, env))

    med = {name: statistics.median(ts) for name, ts in times.items()}
    ratio = med["scaletrain run"] / med["torchrun --standalone"]
    print(f"Machine: {machine()}; {args.nproc} workers, {args.runs} alternating runs each.\n")
    print("| launcher | median wall (s) | min (s) | max (s) |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        print(f"| `{name}` | {med[name]:.3f} | {min(ts):.3f} | {max(ts):.3f} |")
    print(f"\nratio scaletrain / torchrun = **{ratio:.3f}** (target <= 1.05)")


if __name__ == "__main__":
    main()
