"""Where a launcher's time goes: phase timestamps of `scaletrain run` and torchrun, one trivial job.

    python benchmarks/launcher_phases.py [--runs 8] [--compare-src OTHER/src]

The same trivial job as ``launcher_overhead.py`` (gloo, one all_reduce, exit; 2 workers). Each
launcher runs inside this file (``--driver``), which wraps the elastic agent's steps, once torch
imports them, with timestamps, and at exit adds the launcher's own CPU time and its workers'.
The workers write when their process started (from /proc), when the program's first line ran,
and when its last line ran. Times are seconds from the launcher process's start, medians over
the runs; the launchers alternate, the order rotating. CPU times move least with machine load.
The wrappers themselves cost well under a millisecond per launch.
"""

from __future__ import annotations

import argparse
import atexit
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher_overhead import _env  # the same environment: no launcher variables, src first

REPO = Path(__file__).resolve().parent.parent

TRIVIAL = """\
import os, time
started = time.time()
with open("/proc/self/stat") as fh:
    ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
with open("/proc/uptime") as fh:
    exec_at = time.time() - float(fh.read().split()[0]) + ticks / os.sysconf("SC_CLK_TCK")
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
with open(os.environ["PHASE_WORKERS"], "a") as fh:
    fh.write(f"{exec_at} {started} {time.time()}\\n")
"""

ROWS = ["torch imported", "agent started", "rendezvous done", "workers started", "first worker exec",
        "first program line", "last program line", "agent sees the end", "tailers stopped",
        "agent returned", "launcher exit", "launcher CPU (s)", "workers' CPU (s)"]


def _process_start() -> float:
    """This process's start (epoch seconds, 10 ms resolution), from /proc."""
    with open("/proc/self/stat") as fh:
        ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def driver(which: str, argv: list[str]) -> None:
    """Run one launcher in this process, writing its phase timestamps to $PHASE_OUT at exit."""
    from scaletrain.launch.inproc.worker_shim import after_import  # no torch

    started = _process_start()
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        marks.setdefault(name, time.time())  # the first time each phase is reached

    def wrap(owner: Any, name: str, before: str | None, after: str | None) -> None:
        original: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if before:
                mark(before)
            try:
                return original(*args, **kwargs)
            finally:
                if after:
                    mark(after)

        setattr(owner, name, timed)

    def agent(module: Any) -> None:
        cls = module.LocalElasticAgent
        wrap(cls, "run", "agent started", "agent returned")
        wrap(cls, "_rendezvous", None, "rendezvous done")
        wrap(cls, "_start_workers", None, "workers started")

    def pcontext(module: Any) -> None:
        wrap(module.PContext, "close", "agent sees the end", "tailers stopped")

    def report() -> None:
        import resource

        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = {name: at - started for name, at in marks.items()}
        rows["launcher CPU (s)"] = own.ru_utime + own.ru_stime
        rows["workers' CPU (s)"] = kids.ru_utime + kids.ru_stime
        with open(os.environ["PHASE_OUT"], "w") as fh:
            fh.write(f"{started}\n" + "".join(f"{k}\t{v}\n" for k, v in rows.items()))

    after_import({"torch": [lambda _: mark("torch imported")],
                  "torch.distributed.elastic.agent.server.local_elastic_agent": [agent],
                  "torch.distributed.elastic.multiprocessing.api": [pcontext]})
    atexit.register(report)  # registered first, so it runs after every other handler
    module = "scaletrain" if which == "scaletrain" else "torch.distributed.run"
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _once(which: str, src: Path, script: Path, nproc: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out, workers = Path(tmp) / "phases", Path(tmp) / "workers"
        args = (["run"] if which == "scaletrain" else ["--standalone"]) + ["--nproc-per-node", str(nproc), str(script)]
        proc = subprocess.run([sys.executable, __file__, "--driver", which, *args], capture_output=True, text=True,
                              env={**_env(src), "PHASE_OUT": str(out), "PHASE_WORKERS": str(workers)}, timeout=300)
        ended = time.time()
        if proc.returncode != 0:
            sys.exit(f"{which} failed:\n{proc.stdout}\n{proc.stderr}")
        started, *lines = out.read_text().splitlines()
        rows = {k: float(v) for k, v in (line.split("\t") for line in lines)}
        stamps = [tuple(map(float, line.split())) for line in workers.read_text().splitlines()]
    origin = float(started)
    rows["first worker exec"] = min(s[0] for s in stamps) - origin
    rows["first program line"] = min(s[1] for s in stamps) - origin
    rows["last program line"] = max(s[2] for s in stamps) - origin
    rows["launcher exit"] = ended - origin
    return rows


def main() -> None:
    if sys.argv[1:2] == ["--driver"]:
        driver(sys.argv[2], sys.argv[3:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--compare-src", type=Path, help="another tree's src/ for a third arm (before/after)")
    args = p.parse_args()
    arms = {"scaletrain run": ("scaletrain", REPO / "src"), "torchrun": ("torchrun", REPO / "src")}
    if args.compare_src:
        arms[f"scaletrain run ({args.compare_src})"] = ("scaletrain", args.compare_src.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "trivial.py"
        script.write_text(TRIVIAL)
        for which, src in arms.values():  # warm the file cache; not counted
            _once(which, src, script, args.nproc)
        names = list(arms)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for run in range(args.runs):
            for name in names[run % len(names):] + names[:run % len(names)]:
                results[name].append(_once(*arms[name], script, args.nproc))
    print(f"{args.runs} alternating runs each, {args.nproc} workers; load average "
          f"{os.getloadavg()[0]:.1f} at the end. Seconds from the launcher process's start, medians.\n")
    print("| phase | " + " | ".join(f"`{n}`" for n in names) + " |")
    print("|---|" + "---:|" * len(names))
    for row in ROWS:
        cells = [statistics.median(r[row] for r in results[n]) if all(row in r for r in results[n]) else None
                 for n in names]
        print(f"| {row} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
