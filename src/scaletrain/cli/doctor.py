"""``scaletrain doctor``: an environment report for bug reports, and checks inside a job.

Outside a multi-process job it prints the report and exits 0. Inside one (``srun scaletrain
doctor``, or ``scaletrain run --nproc-per-node N -m scaletrain.doctor``) every rank runs the
checks of :mod:`scaletrain.observe.doctor` and the command exits non-zero with a hint on the
first failure. Nothing here imports torch until the verb runs.
"""

from __future__ import annotations

import argparse
import os
import sys

from scaletrain.fileio import json_text

DESCRIPTION = """\
Print what a bug report needs (Python, torch, CUDA/ROCm, NCCL, GPUs, Slurm variables, visible
devices, CPU affinity, network interfaces, NCCL_*/GLOO_* settings). Inside a job every rank also
checks: MASTER_ADDR resolves and is reachable, the port is free, each rank has its own device,
and a short all_reduce is correct and fast enough for the cluster profile."""

EPILOG = """\
examples:
  scaletrain doctor                                   # this process: the report
  srun scaletrain doctor                              # inside an allocation: every rank checks
  scaletrain run --nproc-per-node 2 -m scaletrain.doctor   # local multi-process check
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The doctor flags (shared with ``python -m scaletrain.doctor``)."""
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for rank 0 and the other ranks (default 60)")
    p.add_argument("--size-mb", type=float, default=16.0, metavar="MB",
                   help="all_reduce message size for the bandwidth check (default 16)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run_doctor(args: argparse.Namespace) -> int:
    """CLI body: the report, then the checks when this process is one rank of several."""
    from scaletrain.errors import UsageError
    from scaletrain.observe import envreport
    from scaletrain.runtime.detect import detect

    if not 0 < args.timeout < 1e7 or not 0 < args.size_mb <= 65536:  # also refuses nan and inf
        raise UsageError("--timeout and --size-mb must be positive", "e.g. --timeout 60 --size-mb 16 (at most 65536 MiB)")
    env = detect(os.environ)
    if env.rank == 0:
        report = envreport.collect()
        print(json_text(report, indent=2) if args.json else envreport.render(report))
    if env.world_size == 1:
        if not args.json:
            print("scaletrain doctor: one process, no job checks (run it as 'srun scaletrain doctor' "
                  "in an allocation, or 'scaletrain run --nproc-per-node 2 -m scaletrain.doctor')")
        return 0
    from scaletrain.observe.doctor import run_checks

    lines = run_checks(env, timeout_s=args.timeout, size_mb=args.size_mb, out=print, environ=os.environ)
    if env.rank == 0:
        for line in lines:
            print(f"PASS  {line}")
        print(f"scaletrain doctor: all checks passed on {env.world_size} ranks")
    sys.stdout.flush()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``doctor`` verb."""
    p = subparsers.add_parser("doctor", help="environment report for bug reports; checks inside a job",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run_doctor)
