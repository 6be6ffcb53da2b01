"""``scaletrain plan``: print the Slurm batch script for a job on a known cluster.

The flags are defined once, in ``add_plan_arguments``; ``scaletrain submit`` adds the same
ones and builds its request with ``request_from_args``. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from scaletrain.errors import UsageError

DESCRIPTION = """\
Turn "this script on N GPUs of cluster C" into a Slurm batch script: nodes, partition,
tasks per node for the launcher, CPUs and memory per task, the GPU request in the cluster's
syntax, software set-up, rendezvous and srun. The script goes to stdout (or --output FILE),
a summary to stderr. Nothing is submitted (see 'scaletrain submit')."""

EPILOG = """\
examples:
  scaletrain plan --cluster puhti --gpus 8 --account project_123 -- train.py --epochs 3
  scaletrain plan --cluster mahti --gpus 2 --launcher torchrun --account project_123 -- train.py
  scaletrain plan --cluster lumi --nodes 4 --launcher accelerate --time 12:00:00 -- train.py
  scaletrain plan --cluster narval --gpus 4 --stage-data ~/data/imagenet.tar --requeue -- train.py
  scaletrain plan --cluster juwels-booster --gpus 16 --params 7e9 --json -- train.py
  scaletrain plan --cluster local --gpus 2 -- train.py        # this machine, CPU workers

launchers (tasks per node):
  scaletrain  one task per GPU, srun starts python; scaletrain.init() reads Slurm (default)
  srun        one task per GPU, torch's env:// variables (RANK, WORLD_SIZE, ...) set from Slurm's
  mpi         one task per GPU (Horovod, DeepSpeed in MPI mode, mpi4py programs)
  lightning   one task per GPU; Lightning reads Slurm itself
  torchrun    one task per node running 'scaletrain run' (static rendezvous, a worker per GPU)
  accelerate  one task per node running 'accelerate launch'
  deepspeed   one task per node running the 'deepspeed' launcher
"""


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every flag of ``plan`` (and ``submit``): the job, the cluster and the program."""
    from scaletrain.plan.request import LAUNCHERS

    c = parser.add_argument_group("cluster")
    c.add_argument("--cluster", metavar="NAME",
                   help="cluster profile name (see 'scaletrain clusters'); required unless --profile")
    c.add_argument("--profile", metavar="FILE", help="a cluster profile .toml file (overrides --cluster)")
    c.add_argument("--partition", metavar="P", help="Slurm partition (default: chosen by the profile's rules)")
    c.add_argument("--account", metavar="A",
                   help="project/account to bill (default: $SBATCH_ACCOUNT)")
    s = parser.add_argument_group("size")
    s.add_argument("--gpus", type=int, metavar="N", help="total GPUs (one node if they fit, else whole nodes)")
    s.add_argument("--nodes", type=int, metavar="M", help="number of nodes (with --gpus-per-node)")
    s.add_argument("--gpus-per-node", type=int, metavar="G", help="GPUs per node with --nodes (default: all)")
    s.add_argument("--time", metavar="HH:MM:SS", help="time limit (default 01:00:00; D-HH:MM:SS also)")
    s.add_argument("--cpus-per-gpu", type=int, metavar="C",
                   help="CPU cores per GPU (default: the node's cores shared per GPU)")
    s.add_argument("--mem-per-gpu", metavar="M", help="memory per GPU, e.g. 64G (default: the profile's share)")
    r = parser.add_argument_group("how it runs")
    r.add_argument("--launcher", choices=LAUNCHERS, default="scaletrain",
                   help="launch mode (default scaletrain; see below)")
    r.add_argument("--device", choices=("auto", "cpu"), default="auto",
                   help="cpu: run on the CPU even where GPUs were allocated (SCALETRAIN_DEVICE=cpu)")
    r.add_argument("--container", metavar="IMG", help="run the program in this Apptainer/Singularity image")
    r.add_argument("--stage-data", metavar="PATH",
                   help="copy/extract a dataset (dir, .tar, .tar.gz, .zip) to node-local scratch first; "
                        "the program finds it in $SCALETRAIN_DATA")
    r.add_argument("--requeue", action="store_true",
                   help="USR1 before the time limit, passed to the tasks; the job then requeues itself")
    r.add_argument("--job-name", metavar="NAME", help="Slurm job name (default: the script's name)")
    o = parser.add_argument_group("output")
    o.add_argument("--params", metavar="N", help="model size (7e9, 350M): add per-GPU memory per strategy")
    o.add_argument("--output", "-o", metavar="FILE", help="write the script to FILE instead of stdout")
    o.add_argument("--json", action="store_true", help="print the plan as JSON (script included)")
    parser.add_argument("script", nargs="?", metavar="SCRIPT", help="training script (after '--')")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script, passed unchanged")


def _data_size_gb(path: str, *, max_entries: int = 200_000) -> float | None:
    """Size of a file or folder in GB, or None when it is not here or too big to walk quickly."""
    p = Path(path).expanduser()
    try:
        if p.is_file():
            return p.stat().st_size / 1024 ** 3
        if not p.is_dir():
            return None
        total, seen = 0, 0
        stack = [p]
        while stack:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    seen += 1
                    if seen > max_entries:
                        return None
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        return total / 1024 ** 3
    except OSError:
        return None


def _command(args: argparse.Namespace) -> tuple[str, ...]:
    argv = getattr(args, "_argv", None)
    if argv:
        return ("scaletrain", *argv)
    return ("scaletrain", getattr(args, "verb", None) or "plan", "...")


def request_from_args(args: argparse.Namespace):  # -> JobRequest (lazy import keeps start-up light)
    """Build the JobRequest from parsed ``add_plan_arguments`` flags (used by plan and submit)."""
    from scaletrain.plan.request import JobRequest, parse_mem_gb, parse_params

    if not args.cluster and not args.profile:
        raise UsageError("which cluster? --cluster NAME is required", "see 'scaletrain clusters' for the names")
    if not args.script:
        raise UsageError("no training script given",
                         "put it last, after '--': scaletrain plan --cluster puhti --gpus 4 -- train.py")
    stage = args.stage_data
    stage_gb = _data_size_gb(stage) if stage else None
    if stage:  # the job starts in the submit folder, but an absolute path survives a cd
        stage = os.path.abspath(os.path.expanduser(stage))
    account = args.account or os.environ.get("SBATCH_ACCOUNT") or os.environ.get("SLURM_ACCOUNT") or None
    return JobRequest(
        cluster=args.cluster or Path(args.profile).stem,
        script=args.script,
        script_args=tuple(args.script_args or ()),
        gpus=args.gpus,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        launcher=args.launcher,
        partition=args.partition,
        time=args.time,
        account=account,
        cpus_per_gpu=args.cpus_per_gpu,
        mem_per_gpu_gb=parse_mem_gb(args.mem_per_gpu) if args.mem_per_gpu else None,
        container=args.container,
        stage_data=stage,
        stage_data_gb=stage_gb,
        requeue=bool(args.requeue),
        device=args.device,
        params=parse_params(args.params) if args.params else None,
        job_name=args.job_name,
        command=_command(args),
        profile_file=os.path.abspath(os.path.expanduser(args.profile)) if args.profile else None,
    )


def plan_from_args(args: argparse.Namespace):  # -> Plan
    """Load the profile and make the plan for parsed ``add_plan_arguments`` flags."""
    from scaletrain.clusters.profile import load_profile
    from scaletrain.plan.planner import make_plan

    request = request_from_args(args)
    profile = load_profile(args.profile if args.profile else args.cluster)
    return make_plan(request, profile)


def run_plan(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain plan``."""
    from scaletrain.plan.render import render_script
    from scaletrain.plan.summary import plan_to_dict, render_summary

    plan = plan_from_args(args)
    script = render_script(plan)
    explained = _explain(plan, args.explain) if args.explain else None
    if args.json:
        data = plan_to_dict(plan)
        data["script"] = script
        if explained:
            data["explain"] = explained
        print(json.dumps(data, indent=2, default=str))
        return 0
    if args.output:
        out = Path(args.output)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(script)
            out.chmod(0o755)
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc.strerror}", "choose a writable --output path") from None
    else:
        sys.stdout.write(script)
        sys.stdout.flush()
    print(render_summary(plan), file=sys.stderr)
    if explained:
        print(explained, file=sys.stderr)
    if args.output:
        print(f"scaletrain: wrote {args.output}", file=sys.stderr)
    return 0


def _explain(plan, run: str) -> str:
    from scaletrain.observe.explain import explain_plan  # the logic lives with the scaling model

    return explain_plan(plan, run)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plan`` verb."""
    p = subparsers.add_parser("plan", help="print the Slurm batch script for a job (nothing submitted)",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_arguments(p)
    p.add_argument("--explain", metavar="RUN",
                   help="how many GPUs are worth it: predicted scaling from a measured run (a Monitor "
                        "run folder or summary.json, or a bench scaling.json), printed on stderr")
    p.set_defaults(func=run_plan)
