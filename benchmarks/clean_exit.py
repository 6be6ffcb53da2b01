"""Clean exits: how many 2-process `scaletrain run` jobs end with the expected code, and how many abort.

    python benchmarks/clean_exit.py [--runs 200] [--parallel 3] [--modes plain,save,stop]

Each run is a fresh `scaletrain run --nproc-per-node 2` of benchmarks/clean_exit_worker.py that
trains 4 DDP steps on gloo and then ends plainly (expected exit 0), after a checkpoint save
(0), or after a stop by signal (SIGUSR1 -> agreed stop, save, exit 75). Runs are spread evenly
over the modes and ``--parallel`` jobs run at once, so every job runs under load (2 x
``--parallel`` training processes plus their launchers on this machine's cores), the condition
under which gloo's shutdown race used to abort ("terminate called without an active
exception", SIGABRT: scaletrain.runtime.init._settle_gloo_workers works around it).

An abort is a run whose output mentions ``terminate called``/``Aborted``/``core dumped`` or
whose code is 134 (128+SIGABRT); any other unexpected code is counted apart. Prints a markdown
table per mode; exits 1 if any run aborted or ended with an unexpected code.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).with_name("clean_exit_worker.py")
EXPECTED = {"plain": 0, "save": 0, "stop": 75}
ABORT_MARKERS = ("terminate called", "Aborted", "core dumped", "SIGABRT")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}
           and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO / "src"), env.get("PYTHONPATH", "")] if p)
    env["OMP_NUM_THREADS"] = "1"
    return env


def one_run(mode: str, work: str) -> tuple[str, int, bool, str]:
    """(mode, exit code, aborted?, last lines of output) of one job."""
    cmd = [sys.executable, "-m", "scaletrain", "run", "--nproc-per-node", "2", str(WORKER),
           work, mode]
    try:
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return mode, -1, False, "timed out after 300 s\n" + text[-400:]
    text = proc.stdout + proc.stderr
    aborted = proc.returncode == 134 or any(m in text for m in ABORT_MARKERS)
    return mode, proc.returncode, aborted, text[-600:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="jobs in all (default 200)")
    ap.add_argument("--parallel", type=int, default=3, help="jobs at once (default 3)")
    ap.add_argument("--modes", default="plain,save,stop", help="comma-separated modes")
    ap.add_argument("--log", default=None, metavar="FILE",
                    help="append one JSON line per finished run (counts survive an interruption)")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in EXPECTED:
            ap.error(f"unknown mode {m!r}; choose from {', '.join(EXPECTED)}")
    plan = [modes[i % len(modes)] for i in range(args.runs)]
    counts: dict[str, collections.Counter] = {m: collections.Counter() for m in modes}
    examples: list[str] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="clean_exit_") as work, \
            concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        futures = [pool.submit(one_run, mode, work) for mode in plan]
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            mode, code, aborted, tail = future.result()
            kind = "abort" if aborted else ("ok" if code == EXPECTED[mode] else f"exit {code}")
            counts[mode][kind] += 1
            if args.log:
                with open(args.log, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"mode": mode, "code": code, "kind": kind,
                                         "time": round(time.monotonic() - start, 1)}) + "\n")
            if kind != "ok" and len(examples) < 3:
                examples.append(f"--- {mode}: {kind}\n{tail}")
            if done % 20 == 0:
                print(f"{done}/{len(plan)} runs, {time.monotonic() - start:.0f} s", file=sys.stderr)
    elapsed = time.monotonic() - start
    print(f"Clean exits of 2-process `scaletrain run` jobs ({platform.node()}, {os.cpu_count()} "
          f"cores, {args.parallel} jobs at once, {elapsed:.0f} s)\n")
    print("| ending | expected code | runs | expected | aborts | other codes |")
    print("|---|---:|---:|---:|---:|---|")
    bad = 0
    for mode in modes:
        c = counts[mode]
        other = {k: v for k, v in c.items() if k not in ("ok", "abort")}
        bad += c["abort"] + sum(other.values())
        print(f"| {mode} | {EXPECTED[mode]} | {sum(c.values())} | {c['ok']} | {c['abort']} | "
              f"{', '.join(f'{k}: {v}' for k, v in sorted(other.items())) or '-'} |")
    for example in examples:
        print(example, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
