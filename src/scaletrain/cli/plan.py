"""``scaletrain plan``: print the Slurm batch script for a job on a known cluster.

The flags are defined once, in ``add_plan_arguments``; ``scaletrain submit`` adds the same
ones and builds its request with ``request_from_args``. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scaletrain.cli import args as A
from scaletrain.contract.environ import DATA_VAR, DEVICE_VAR, TIME_LIMIT_SIGNAL
from scaletrain.errors import UsageError
from scaletrain.fileio import json_text

if TYPE_CHECKING:
    from scaletrain.plan.records import Plan
    from scaletrain.plan.request import JobRequest

DESCRIPTION = """\
Turn "this script on N GPUs of cluster C" into a Slurm batch script: nodes, partition,
tasks per node for the launcher, CPUs and memory per task, the GPU request in the cluster's
syntax, software set-up, rendezvous and srun. The script goes to stdout (or --output FILE),
a summary to stderr. Nothing is submitted (see 'scaletrain submit')."""

EPILOG = """\
examples:
  scaletrain plan --cluster roihu --gpus 8 --account project_123 -- train.py --epochs 3
  scaletrain plan --cluster roihu --gpus 2 --launcher torchrun --account project_123 -- train.py
  scaletrain plan --cluster lumi --nodes 4 --launcher accelerate --time 12:00:00 --account project_465000123 -- train.py
  scaletrain plan --cluster roihu --nodes 2 --launcher deepspeed --deepspeed-config zero3 --precision bf16 --account project_123 -- train.py
  scaletrain plan --cluster narval --gpus 4 --stage-data ~/data/imagenet.tar --requeue --account def-someone -- train.py
  scaletrain plan --cluster juwels-booster --gpus 16 --params 7e9 --json --account training2324 -- train.py
  scaletrain plan --cluster roihu --gpus 4 --account project_123 --mail-type END,FAIL --mail-user me@uni.fi --venv /projappl/project_123/env -- train.py
  scaletrain plan --cluster roihu --gpus 4 --account project_123 --expand-args -- train.py --out '$TMPDIR/run-$SLURM_JOB_ID'
  scaletrain plan --cluster local --gpus 2 -- train.py        # this machine, CPU workers

launchers (tasks per node; what the training program reads):
{launchers}

Every value is checked and quoted: program arguments reach the program literally, unless
--expand-args lets $NAME in them expand when the job runs. Jobs that import scaletrain
check for it first; see docs/clusters.md for installing it next to a centre's PyTorch.
"""


def epilog() -> str:
    """The help epilog, with one line per launcher from the launcher table."""
    from scaletrain.plan.launchers import describe

    return EPILOG.format(launchers=describe())


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every flag of ``plan`` (and ``submit``): the job, the cluster and the program."""
    _add_cluster_and_size(parser)
    _add_how_it_runs(parser)
    _add_sbatch_and_software(parser)
    o = parser.add_argument_group("output")
    o.add_argument("--params", type=A.params, metavar="N", help="model size (7e9, 350M): add per-GPU memory per strategy")
    o.add_argument("--output", "-o", type=A.text(), metavar="FILE", help="write the script to FILE instead of stdout")
    o.add_argument("--json", action="store_true", help="print the plan as JSON (script included)")
    parser.add_argument("script", nargs="?", metavar="SCRIPT", help="training script (after '--')")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script, passed unchanged")


def _add_cluster_and_size(parser: argparse.ArgumentParser) -> None:
    c = parser.add_argument_group("cluster")
    c.add_argument("--cluster", type=A.name, metavar="NAME",
                   help="cluster profile name (see 'scaletrain clusters'); required unless --profile")
    c.add_argument("--profile", type=A.text(), metavar="FILE", help="a cluster profile .toml file (overrides --cluster)")
    c.add_argument("--partition", type=A.name, metavar="P", help="Slurm partition (default: chosen by the profile's rules)")
    c.add_argument("--account", type=A.name, metavar="A",
                   help="project/account to bill (default: $SBATCH_ACCOUNT)")
    s = parser.add_argument_group("size")
    s.add_argument("--gpus", type=A.count(), metavar="N", help="total GPUs (one node if they fit, else whole nodes)")
    s.add_argument("--nodes", type=A.count(), metavar="M", help="number of nodes (with --gpus-per-node)")
    s.add_argument("--gpus-per-node", type=A.count(), metavar="G", help="GPUs per node with --nodes (default: all)")
    s.add_argument("--time", type=A.time_limit, metavar="HH:MM:SS", help="time limit (default 01:00:00; D-HH:MM:SS also)")
    s.add_argument("--cpus-per-gpu", type=A.count(), metavar="C",
                   help="CPU cores per GPU (default: the node's cores shared per GPU)")
    s.add_argument("--mem-per-gpu", type=A.mem_size, metavar="M", help="memory per GPU, e.g. 64G (default: the profile's share)")
    s.add_argument("--gpus-per-proc", type=A.count(), default=1, metavar="G",
                   help="one process drives G GPUs (model parallel; default 1)")
    s.add_argument("--procs-per-gpu", type=A.count(), default=1, metavar="K",
                   help="K processes share each GPU through NVIDIA MPS (one node; default 1)")
    s.add_argument("--cpus", type=A.count(), metavar="N",
                   help="a CPU-only job: N cores for the process (threads = N), no GPUs")
    # sbatch's --mem is per node; taking it as --mem-per-gpu (argparse's prefix match) was wrong
    s.add_argument("--mem", action=A.refuse("plan asks memory per GPU: use --mem-per-gpu M "
                                             "(per node = M x GPUs per node)"),
                   help=argparse.SUPPRESS)


def _add_how_it_runs(parser: argparse.ArgumentParser) -> None:
    from scaletrain.parallel.options import PRECISIONS
    from scaletrain.plan.launchers import LAUNCHERS

    r = parser.add_argument_group("how it runs")
    r.add_argument("--launcher", choices=LAUNCHERS, default="scaletrain",
                   help="launch mode (default scaletrain; see below)")
    r.add_argument("--device", choices=("auto", "cpu"), default="auto",
                   help=f"cpu: run on the CPU even where GPUs were allocated ({DEVICE_VAR}=cpu)")
    r.add_argument("--container", type=A.text(), metavar="IMG", help="run the program in this Apptainer/Singularity image")
    r.add_argument("--stage-data", type=A.data_path, metavar="PATH",
                   help="copy/extract a dataset (dir, .tar, .tar.gz, .zip) to node-local scratch first; "
                        f"the program finds it in ${DATA_VAR}")
    r.add_argument("--sample-gpus", type=A.count(low=1, high=3600), metavar="S",
                   help="start one GPU sampler per node (NVML/AMD SMI) reading every S seconds into the job's "
                        "folder, for 'scaletrain report' on programs without the Monitor")
    r.add_argument("--requeue", action="store_true",
                   help=f"{TIME_LIMIT_SIGNAL} before the time limit, passed to the tasks; the job then requeues itself")
    r.add_argument("--job-name", type=A.job_name, metavar="NAME", help="Slurm job name (default: the script's name)")
    r.add_argument("--accelerate-config", type=A.text(), metavar="NAME|FILE",
                   help="with --launcher accelerate: ddp, fsdp-shard-grad-op, fsdp-full-shard, fsdp-offload or "
                        "hsdp (older names zero2, zero3, fsdp, offload still work; the job writes "
                        "Accelerate's config and passes it), or your own config FILE; scaletrain adds only "
                        "the layout flags")
    r.add_argument("--deepspeed-config", type=A.text(), metavar="NAME|FILE",
                   help="zero1, zero2, zero3, offload (to CPU memory) or nvme (to node-local disk): the job "
                        "writes DeepSpeed's config; or your own FILE. The program gets --deepspeed "
                        "--deepspeed_config PATH, as in the centres' guides (see docs/bring-your-script.md)")
    r.add_argument("--precision", choices=tuple(PRECISIONS), default="fp32",
                   help="mixed precision in the configs --accelerate-config/--deepspeed-config write (default fp32)")
    r.add_argument("--micro-batch", type=A.count(), metavar="N",
                   help="with --deepspeed-config NAME: the per-GPU micro-batch (train_micro_batch_size_per_gpu)")
    r.add_argument("--expand-args", action="store_true",
                   help="let $NAME / ${NAME} in the program's arguments expand when the job runs (job-wide "
                        "values such as $SLURM_JOB_ID; nothing else is interpreted); default: passed literally")


def _add_sbatch_and_software(parser: argparse.ArgumentParser) -> None:
    j = parser.add_argument_group("sbatch options")
    for flag, metavar, text in (
            ("--mail-type", "TYPES", "mail on these events, e.g. END,FAIL"),
            ("--mail-user", "ADDR", "where the mail goes"),
            ("--array", "SPEC", "job array, e.g. 0-9 or 0-99%%10 ($SLURM_ARRAY_TASK_ID in the job)"),
            ("--constraint", "FEATURES", "node features, e.g. a100"),
            ("--dependency", "DEP", "e.g. afterok:123456 or singleton"),
            ("--reservation", "NAME", "run in a reservation (courses)"),
            ("--qos", "QOS", "quality of service"),
            ("--log", "PATTERN", "the job's output file (default %%x-%%j.out)"),
            ("--error", "PATTERN", "a separate error file (default: with the output)"),
            ("--chdir", "DIR", "the job's working directory (submit: the folder you submit from)")):
        j.add_argument(flag, type=A.text(), metavar=metavar, help=text)
    j.add_argument("--exclusive", action="store_true", help="whole nodes for this job only")
    j.add_argument("--sbatch", action="append", default=[], metavar="OPTION[=VALUE]",
                   help="any other #SBATCH option (repeatable), e.g. --sbatch begin=now+1hour; refused "
                        "when the plan computes it")
    w = parser.add_argument_group("software (replaces or extends the profile's set-up)")
    w.add_argument("--module", action="append", default=[], metavar="M",
                   help="module to load instead of the profile's (repeatable)")
    w.add_argument("--venv", metavar="DIR", help="activate this virtualenv (DIR/bin/activate)")
    w.add_argument("--conda", metavar="ENV", help="activate this conda environment")
    w.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="export a variable for the job (repeatable; the value is passed literally)")
    w.add_argument("--setup", action="append", default=[], metavar="CMD",
                   help="a shell line to run after the set-up (repeatable; run as written)")


def _command(args: argparse.Namespace) -> tuple[str, ...]:
    argv = getattr(args, "_argv", None)
    if argv:
        return ("scaletrain", *argv)
    return ("scaletrain", getattr(args, "verb", None) or "plan", "...")


def request_from_args(args: argparse.Namespace) -> JobRequest:
    """Build the JobRequest from parsed ``add_plan_arguments`` flags (used by plan and submit).

    Only the flags are read here; what this machine tells (the data's size, the account default,
    the running environment) is read by the one sequence, :func:`scaletrain.jobs.submit.plan_job`.
    """
    from scaletrain.envs.create import check_venv_dir
    from scaletrain.envs.finished import finished_env
    from scaletrain.plan.request import JobRequest, parse_mem_gb, parse_params

    if not args.cluster and not args.profile:
        raise UsageError("which cluster? --cluster NAME is required", "see 'scaletrain clusters' for the names")
    if not args.script:
        raise UsageError("no training script given",
                         "put it last, after '--': scaletrain plan --cluster roihu --gpus 4 -- train.py")
    if args.profile and not os.path.lexists(os.path.expanduser(args.profile)):
        from scaletrain.clusters.profile import list_profiles

        if args.profile in list_profiles():   # a shipped profile's name given where a file goes
            raise UsageError(f"--profile {args.profile}: no such file; {args.profile} is the name of a "
                             "shipped cluster profile", f"use --cluster {args.profile}")
    venv = check_venv_dir("--venv", os.path.abspath(os.path.expanduser(args.venv))) if args.venv else None
    unfinished = finished_env(venv) if venv and os.path.lexists(venv) else None  # absent: the cluster's path
    if unfinished:
        raise UsageError(f"--venv: {unfinished}", "make the environment with 'scaletrain env create "
                         "--cluster NAME DIR' (or give a finished one)")
    accel = _config_arg(args.accelerate_config, "--accelerate-config")
    ds = _config_arg(args.deepspeed_config, "--deepspeed-config")
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
        account=args.account,
        cpus_per_gpu=args.cpus_per_gpu,
        mem_per_gpu_gb=parse_mem_gb(args.mem_per_gpu) if args.mem_per_gpu else None,
        container=args.container,
        stage_data=args.stage_data,
        requeue=bool(args.requeue),
        sample_gpus=getattr(args, "sample_gpus", None),
        device=args.device,
        params=parse_params(args.params) if args.params else None,
        job_name=args.job_name,
        command=_command(args),
        profile_file=os.path.abspath(os.path.expanduser(args.profile)) if args.profile else None,
        mail_type=args.mail_type, mail_user=args.mail_user, array=args.array, constraint=args.constraint,
        exclusive=bool(args.exclusive), dependency=args.dependency, reservation=args.reservation,
        qos=args.qos, log=args.log, error_log=args.error, chdir=args.chdir,
        sbatch_extra=tuple(_pair(x, "--sbatch", required=False) for x in args.sbatch),
        modules=tuple(args.module), venv=venv, conda=args.conda,
        env=tuple(_pair(x, "--env", required=True) for x in args.env), setup=tuple(args.setup),
        accelerate_config=accel, deepspeed_config=ds, precision=args.precision, micro_batch=args.micro_batch,
        expand_args=bool(args.expand_args),
        gpus_per_proc=args.gpus_per_proc, procs_per_gpu=args.procs_per_gpu, cpus=args.cpus,
    )


def _config_arg(value: str | None, flag: str) -> str | None:
    """A strategy name as given (the planner checks it), or the user's config file as an absolute path.

    A file the job will read is checked now, when its folder is on this machine: a typo found after
    the queue wait costs the wait. A path whose folder is not here (a plan made on a laptop for the
    cluster's /scratch) is left for the job.
    """
    from scaletrain.plan.jobfiles import is_file

    if not value:
        return None
    if not is_file(value):
        return value
    path = Path(os.path.abspath(os.path.expanduser(value)))
    if path.is_dir():
        raise UsageError(f"{flag} {value}: is a folder, not a config file", "give the config file's path")
    if not path.exists() and path.parent.is_dir():
        raise UsageError(f"{flag} {value}: no such file ({path})",
                         "check the file name; a built-in config is named without a dot or slash "
                         f"(see 'scaletrain plan --help' for {flag})")
    return str(path)


def _pair(text: str, flag: str, *, required: bool) -> tuple[str, str]:
    """``KEY=VALUE`` (or a bare ``KEY`` where the value is optional) as a pair."""
    key, eq, value = text.partition("=")
    if not key or (required and not eq):
        raise UsageError(f"{flag} {text!r}: expected KEY=VALUE", f"e.g. {flag} " +
                         ("NCCL_DEBUG=INFO" if flag == "--env" else "begin=now+1hour"))
    return key, value


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The plan for parsed ``add_plan_arguments`` flags, by the one sequence ``submit`` and
    ``scaletrain.submit()`` run too (:func:`scaletrain.jobs.submit.plan_job`)."""
    from scaletrain.jobs.submit import plan_job

    return plan_job(request_from_args(args))


def run_plan(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain plan``."""
    from scaletrain.fileio import write_output
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
        print(json_text(data, indent=2, default=str))
        return 0
    if args.output:
        write_output(args.output, script)
    else:
        sys.stdout.write(script)
        sys.stdout.flush()
    print(render_summary(plan), file=sys.stderr)
    if explained:
        print(explained, file=sys.stderr)
    if args.output:
        print(f"scaletrain: wrote {args.output}", file=sys.stderr)
    return 0


def _explain(plan: Plan, run: str) -> str:
    from scaletrain.bench.explain import explain_plan  # the logic lives with the scaling model

    return explain_plan(plan, run)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plan`` verb."""
    p = subparsers.add_parser("plan", help="print the Slurm batch script for a job (nothing submitted)",
                              description=DESCRIPTION, epilog=epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_arguments(p)
    p.add_argument("--explain", metavar="RUN",
                   help="how many GPUs are worth it: predicted scaling from a measured run (a Monitor "
                        "run folder or summary.json, or a bench scaling.json), printed on stderr")
    p.set_defaults(func=run_plan)
