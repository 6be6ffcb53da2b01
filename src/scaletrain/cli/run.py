"""``scaletrain run``: start N local workers of a training script, torchrun-compatible.

Everything heavy (torch, the elastic agent) is imported inside ``run`` so that
``scaletrain run --help`` stays instant.
"""

from __future__ import annotations

import argparse
import os
import sys

from scaletrain.cli.args import count, name

DESCRIPTION = """\
Start workers of SCRIPT (or -m MODULE) on this machine with torch's elastic agent.
Each worker gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...),
so any torchrun script runs unchanged; scaletrain.init() reads it.
Threads: each worker gets cores/workers OpenMP threads unless OMP_NUM_THREADS is set.
A MASTER_ADDR/MASTER_PORT already in your environment is used, never replaced."""

EPILOG = """\
examples:
  scaletrain run --nproc-per-node 2 examples/cifar10_cnn.py --epochs 1
  scaletrain run train.py --lr 0.1                      # one worker per GPU (1 on a CPU machine)
  scaletrain run --ranks 0 -m mypkg.train --config a.yaml
  scaletrain run --procs-per-gpu 4 train.py             # 4 ranks per GPU (gloo, CUDA MPS)
  scaletrain run --emulate slurm --nnodes 2 --nproc-per-node 2 train.py   # a program written for srun
  scaletrain run --cpu --nproc-per-node 2 cuda_train.py   # smoke-test a CUDA/NCCL program on the CPU
  scaletrain run --max-restarts 2 --timeout 300 train.py  # resume after a crash; end a hang in 5 min
  # two nodes (run on each, node-rank 0 and 1):
  scaletrain run --nnodes 2 --node-rank 0 --master-addr node1 --master-port 29500 train.py
"""


def _nproc(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        number: int = count(low=0)(value)   # 0 is refused with its reason later
        return number
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {value!r:.40}") from None


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value!r}")
    return seconds


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``run`` verb."""
    p = subparsers.add_parser(
        "run", help="start local workers of a training script (torchrun-compatible)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    w = p.add_argument_group("workers")
    w.add_argument("--nproc-per-node", type=_nproc, default="auto", metavar="N|auto",
                   help="workers on this node (default auto: one per visible GPU, 1 without)")
    w.add_argument("--procs-per-gpu", type=count(), default=None, metavar="K",
                   help="K workers per GPU (gloo between them; starts CUDA MPS when available)")
    w.add_argument("--max-restarts", type=count(low=0), default=0, metavar="K",
                   help="restart all workers up to K times after a failure (default 0; one node only)")
    w.add_argument("--ranks", choices=("all", "0"), default="all",
                   help="whose output to show: all (default) or 0; lines are prefixed [rank N]")
    b = p.add_argument_group("bring your script")
    b.add_argument("--emulate", choices=("slurm", "mpi"), default=None,
                   help="give each worker srun's (SLURM_PROCID, ...) or mpirun's (OMPI_COMM_WORLD_*) "
                        "variables (torchrun's you exported are kept); with --nnodes M the workers "
                        "are spread over M emulated nodes here")
    b.add_argument("--cpu", action="store_true",
                   help="CPU smoke test of a CUDA/NCCL program: NCCL becomes gloo, CUDA devices "
                        "(.cuda(), .to(local_rank), DeviceMesh('cuda')) are the CPU, streams are "
                        "no-ops; docs/bring-your-script.md lists what it cannot map")
    b.add_argument("--strict", action="store_true",
                   help="exit 1 when the workers finish without forming one process group "
                        "(default: a warning)")
    f = p.add_argument_group("failures")
    f.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="end the run when a collective waits longer than this once training "
                        "runs, in scripts that call scaletrain.init() (default 600; start-up "
                        "keeps init()'s 30 minutes)")
    f.add_argument("--run-dir", default=None, metavar="DIR",
                   help="where error records and, after a hang, every rank's Python stack go "
                        "(default: a temporary folder, kept and named only after a hang)")
    n = p.add_argument_group("several nodes (static rendezvous)")
    n.add_argument("--nnodes", type=count(), default=1, metavar="M", help="number of nodes (default 1)")
    n.add_argument("--node-rank", type=count(low=0), default=0, metavar="R", help="this node's index, 0..M-1")
    n.add_argument("--master-addr", type=name, default=None, metavar="HOST",
                   help="host of node rank 0 (default: $MASTER_ADDR)")
    n.add_argument("--master-port", type=count(high=65535), default=None, metavar="PORT",
                   help="rendezvous port (default: $MASTER_PORT; a free one on one node; 29500 on several)")
    p.add_argument("-m", "--module", action="store_true",
                   help="the target is a module name, run like python -m")
    p.add_argument("target", metavar="SCRIPT|MODULE", help="training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="passed to the script unchanged")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Resolve the request, launch, and return the exit code."""
    from scaletrain.launch import lean

    # this process only supervises: torch's import and teardown are overhead (launch/lean.py)
    with lean.cli_launch():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from scaletrain.launch.gpus import count_visible_gpus
    from scaletrain.launch.local import launch
    from scaletrain.launch.spec import RunRequest, plan_launch

    request = RunRequest(
        target=args.target, args=tuple(args.args), module=args.module,
        nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, node_rank=args.node_rank,
        master_addr=args.master_addr, master_port=args.master_port,
        max_restarts=args.max_restarts, ranks=args.ranks, procs_per_gpu=args.procs_per_gpu,
        emulate=args.emulate, cpu=args.cpu, strict=args.strict,
        timeout_s=args.timeout, run_dir=args.run_dir,
    )
    plan = plan_launch(request, environ=os.environ, gpus=count_visible_gpus())
    print(f"scaletrain: {plan.describe()}", file=sys.stderr, flush=True)
    note = plan.waiting_note()
    if note:
        print(f"scaletrain: {note}", file=sys.stderr, flush=True)
    return launch(plan)
