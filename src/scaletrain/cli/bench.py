"""``scaletrain bench``: ``scaling`` (a workload at several sizes) and ``comm`` (collective bandwidth).

Nothing here imports torch: the workers do, in their own processes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaletrain.contract.files import SCALING_REPORT
from scaletrain.errors import LaunchError, ScaletrainError, UsageError

if TYPE_CHECKING:
    from scaletrain.bench.scaling_slurm import SlurmScaling

DESCRIPTION = """\
Measure how training scales on this machine or allocation.
  scaling  a built-in workload (cnn, resnet, gpt on synthetic data) at each size, through
           'scaletrain run' (--nproc) or one Slurm job per size (--nodes); per-device
           throughput, speed-up, parallel efficiency and the scaling model's prediction;
           writes DIR/scaling.json, scaling.png, scaling.html
  comm     all_reduce/all_gather/reduce_scatter/broadcast bandwidth per message size
           (nccl-tests' algbw and busbw); writes DIR/comm.json"""

SCALING_EXAMPLES = """\
examples:
  scaletrain bench scaling --workload cnn --nproc 1,2,4 --steps 50 --out bench/
  scaletrain bench scaling --workload gpt --nproc 1,2 --mode strong --out bench/
  scaletrain bench scaling --cluster roihu --account project_123 --nodes 1,2,4 --out bench/  # Slurm jobs
"""
COMM_EXAMPLES = """\
examples:
  scaletrain bench comm --nproc 2 --sizes 1K..64M --out bench/
  srun scaletrain bench comm --sizes 1K..1G --out bench/     # every task of an allocation
"""
EPILOG = SCALING_EXAMPLES + COMM_EXAMPLES.replace("examples:\n", "")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _local_procs(text: str) -> int:
    from scaletrain.bench.scaling import MAX_PROCS

    value = _positive_int(text)
    if value > MAX_PROCS:
        raise argparse.ArgumentTypeError(f"at most {MAX_PROCS} local processes, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value < 1e7:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


# flags that only mean something for one Slurm job per size
_SLURM_ONLY = ("gpus_per_node", "account", "partition", "time", "device")


def _slurm_request(args: argparse.Namespace) -> SlurmScaling:
    """The ``--nodes`` form's flag checks (the plans and sbatch's presence are checked before submitting)."""
    from scaletrain.bench.scaling import parse_nproc
    from scaletrain.bench.scaling_slurm import SlurmScaling, check_slurm_profile
    from scaletrain.slurm.submit import account_or_env

    if args.nproc is not None:
        raise UsageError("--nodes and --nproc exclude each other: --nodes runs one Slurm job per size, "
                         "--nproc local processes", "give one of them, e.g. --nodes 1,2,4 --cluster NAME")
    nodes = parse_nproc(args.nodes, "--nodes")
    if not args.cluster:
        raise UsageError("--nodes needs --cluster NAME: the Slurm cluster the jobs go to",
                         "e.g. --cluster roihu (see 'scaletrain clusters'), or a profile file --cluster my.toml")
    if not args.out:
        raise UsageError("--nodes needs --out DIR: the jobs write their results there",
                         "give a folder on a file system the compute nodes share, e.g. --out bench/")
    check_slurm_profile(args.cluster)
    return SlurmScaling(
        nodes=nodes, cluster=args.cluster, out_dir=Path(args.out).expanduser(),
        gpus_per_node=args.gpus_per_node,
        account=account_or_env(args.account),
        partition=args.partition, time=args.time, device=args.device or "auto", timeout_s=args.timeout,
        command=("scaletrain", *getattr(args, "_argv", ("bench", "scaling"))))


def run_scaling_cli(args: argparse.Namespace) -> int:
    """CLI body of ``bench scaling``: local processes (``--nproc``) or Slurm jobs (``--nodes``)."""
    from scaletrain.bench.report import SCALING_HTML, SCALING_PNG, format_table, write_report
    from scaletrain.bench.scaling import ScalingRequest, parse_nproc, run_scaling
    from scaletrain.bench.workloads import WORKLOADS

    if args.workload not in WORKLOADS:
        raise UsageError(f"unknown workload {args.workload!r}", f"use one of: {', '.join(WORKLOADS)}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be 0 or more, got {args.warmup}", "e.g. --warmup 3")
    if args.warmup >= args.steps:
        raise UsageError(f"--warmup {args.warmup} leaves no measured steps of --steps {args.steps}",
                         "use more --steps than --warmup")
    slurm = _slurm_request(args) if args.nodes is not None else None
    if slurm is None:
        given = [f"--{k.replace('_', '-')}" for k in _SLURM_ONLY if getattr(args, k, None) is not None]
        if given:
            raise UsageError(f"{given[0]} goes with --nodes (one Slurm job per size)",
                             "add --nodes 1,2,... --cluster NAME, or leave it out for local --nproc runs")
        if args.cluster:
            from scaletrain.clusters.profile import load_profile

            load_profile(args.cluster)  # unknown names fail now, not after the runs
    if args.out:
        _check_out(Path(args.out).expanduser(), SCALING_REPORT)
    req = ScalingRequest(workload=args.workload, nproc=parse_nproc(args.nproc or "1,2"), strategy=args.strategy,
                         mode=args.mode, steps=args.steps, warmup=args.warmup, batch=args.batch,
                         cluster=args.cluster, timeout_s=args.timeout)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if slurm is not None:
        from scaletrain.bench.scaling_slurm import run_slurm_scaling

        doc = run_slurm_scaling(req, slurm, log=log)
    else:
        doc = run_scaling(req, log=log)
    doc["command"] = " ".join(("scaletrain", *getattr(args, "_argv", ("bench", "scaling"))))
    print(format_table(doc))
    _store_calibration(doc)
    if args.out:
        for note in write_report(doc, args.out):
            print(f"scaletrain bench: {note}", file=sys.stderr)
        out = Path(args.out).expanduser()
        written = [out / SCALING_REPORT, out / SCALING_HTML] + [p for p in [out / SCALING_PNG] if p.exists()]
        print("scaletrain bench: wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    failed = doc.get("failed") or []
    if failed:
        first = failed[0]
        raise ScaletrainError(f"bench scaling: {len(failed)} of {len(failed) + len(doc['rows'])} sizes failed; "
                              f"{first['nodes']} node(s): {first['reason']}",
                              f"the report has the sizes that ran; {first['hint']}")
    return 0


def _store_calibration(doc: dict[str, Any]) -> None:
    """Keep the measured distributed overhead where ``plan --explain`` on the same cluster finds it."""
    from scaletrain.observe.overhead import save_calibration

    cal = doc.get("calibration")
    if not cal:
        return
    try:
        path = save_calibration(cal["cluster"], cal)
    except OSError as exc:
        print(f"scaletrain bench: the calibration was not stored: {exc}", file=sys.stderr)
        return
    print(f"scaletrain bench: distributed overhead {cal['at_two_s'] * 1000:.1f} ms per step at 2 processes on "
          f"{cal['cluster']!r}, stored in {path}: 'plan --explain' on {cal['cluster']!r} uses it", file=sys.stderr)


def _check_out(out: Path, report: str) -> None:
    """Say, before the runs, that an earlier report in ``out`` will be replaced (never silently)."""
    try:
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out}: is a file, not a folder", "give a folder, e.g. --out bench/")
        old = out / report
        earlier = old.is_file()
    except OSError as exc:   # a name too long, a folder we may not read
        raise UsageError(f"--out {out}: {exc.strerror or exc}", "give a folder you can write, e.g. --out bench/") from None
    if earlier:
        import time

        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(old.stat().st_mtime))
        print(f"scaletrain bench: {old} (from {when}) will be replaced; give another --out to keep it",
              file=sys.stderr)


def run_comm_cli(args: argparse.Namespace) -> int:
    """CLI body of ``bench comm``: in-process inside a job, else local workers through the launcher."""
    from scaletrain.bench.comm import parse_ops, parse_sizes
    from scaletrain.runtime.detect import detect

    parse_ops(args.ops), parse_sizes(args.sizes)  # bad values fail here, before any process starts
    if args.out:
        from scaletrain.fileio import writable_dir
        writable_dir(args.out, "--out")
    if (args.iters is not None and args.iters < 1) or args.warmup < 0:
        raise UsageError("--iters must be at least 1 and --warmup 0 or more", "e.g. --iters 20 --warmup 3")
    if detect(os.environ).world_size > 1:
        from scaletrain.bench import comm_worker

        comm_worker.run(args)
        return 0
    cmd = [sys.executable, "-m", "scaletrain", "run", "--nproc-per-node", str(args.nproc), "--ranks", "0",
           "-m", "scaletrain.bench.comm_worker", "--ops", args.ops, "--sizes", args.sizes,
           "--warmup", str(args.warmup)]
    if args.iters:
        cmd += ["--iters", str(args.iters)]
    if args.out:
        cmd += ["--out", args.out]
    try:
        proc = subprocess.run(cmd, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"bench comm did not finish within {args.timeout:g} s",
                          "use fewer --sizes or smaller ones, or a longer --timeout") from None
    return proc.returncode


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` verb with its ``scaling`` and ``comm`` sub-commands."""
    from scaletrain.bench.comm_worker import add_arguments as add_comm_arguments
    from scaletrain.cli import args as A

    p = subparsers.add_parser("bench", help="scaling and communication benchmarks",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="bench", metavar="KIND", parser_class=type(p))
    s = sub.add_parser("scaling", help="a built-in workload at several sizes; efficiency and model",
                       description="Run a built-in workload at each size and report scaling.",
                       epilog=SCALING_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--workload", default="cnn", help="cnn, resnet or gpt (default cnn)")
    s.add_argument("--nproc", metavar="LIST", help="local process counts, e.g. 1,2,4 (default 1,2)")
    s.add_argument("--strategy", default="ddp", help="parallel strategy (default ddp; see scaletrain.setup)")
    s.add_argument("--mode", choices=("weak", "strong"), default="weak",
                   help="weak: the same batch per device; strong: the same global batch (default weak)")
    s.add_argument("--steps", type=_positive_int, default=30, metavar="N", help="steps per size (default 30)")
    s.add_argument("--warmup", type=A.count(low=0), default=3, metavar="N", help="first steps left out (default 3)")
    s.add_argument("--batch", type=_positive_int, default=32, metavar="B",
                   help="batch per device (weak) or global (strong) (default 32)")
    s.add_argument("--cluster", metavar="NAME", help="predict with this cluster profile's bandwidths; with "
                   "--nodes, the Slurm cluster (a profile name or .toml file)")
    s.add_argument("--timeout", type=_seconds, default=900.0, metavar="S",
                   help="per size; with --nodes, for all jobs together, queue time included (default 900)")
    s.add_argument("--out", metavar="DIR", help="write scaling.json, scaling.png, scaling.html here "
                   "(with --nodes also the job folders; on a shared file system)")
    g = s.add_argument_group("on Slurm: one job per size, submitted together (cancelled on Ctrl-C or timeout)")
    g.add_argument("--nodes", metavar="LIST", help="node counts, e.g. 1,2,4 (instead of --nproc; needs --cluster)")
    g.add_argument("--gpus-per-node", type=A.count(), metavar="G", help="GPUs per node (default: all)")
    g.add_argument("--account", type=A.name, metavar="A", help="project to bill (default: $SBATCH_ACCOUNT)")
    g.add_argument("--partition", type=A.name, metavar="P", help="partition (default: the profile's choice)")
    g.add_argument("--time", type=A.time_limit, metavar="HH:MM:SS", help="time limit per job (default 00:20:00)")
    g.add_argument("--device", choices=("auto", "cpu"), help="cpu: run on the CPU where GPUs were allocated")
    s.set_defaults(func=run_scaling_cli)
    c = sub.add_parser("comm", help="collective bandwidth per message size",
                       description="all_reduce/all_gather/reduce_scatter/broadcast bandwidth (nccl-tests definitions).",
                       epilog=COMM_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--nproc", type=_local_procs, default=2, metavar="N",
                   help="local processes when not inside a job (default 2)")
    c.add_argument("--timeout", type=_seconds, default=900.0, metavar="S", help="(default 900)")
    add_comm_arguments(c)
    c.set_defaults(func=run_comm_cli)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
