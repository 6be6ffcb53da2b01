"""What the user asked for: a ``JobRequest``, and the parsing of its flag values.

The request is plain data, validated once when it is made (``JobRequest.__post_init__``): every
value it carries to a script, its counts, its launcher and device. ``scaletrain plan`` and
``scaletrain submit`` build it from the same flags (``scaletrain.cli.plan.add_plan_arguments`` /
``request_from_args``); the planner trusts it and turns it and a cluster profile into a ``Plan``
without any I/O, checking only what depends on the cluster.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from scaletrain.contract import JOB_LOG
from scaletrain.errors import UsageError
from scaletrain.plan.values import MAX_COUNT, check_request_values
from scaletrain.slurm.parse import parse_mem_mib

# Launch modes and their facts live in one table (scaletrain.plan.launchers).
from scaletrain.plan.launchers import LAUNCHERS, SPECS

PER_NODE_LAUNCHERS: frozenset[str] = frozenset(n for n, s in SPECS.items() if s.per_node)
DEVICES: tuple[str, ...] = ("auto", "cpu")
# The job options with their own flags: (sbatch option, request field).
JOB_OPTIONS = (("mail-type", "mail_type"), ("mail-user", "mail_user"), ("array", "array"),
               ("constraint", "constraint"), ("dependency", "dependency"),
               ("reservation", "reservation"), ("qos", "qos"))


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """A job as the user describes it; every field maps to one ``plan``/``submit`` flag.

    Exactly one of ``gpus`` and ``nodes`` is set; ``gpus_per_node`` only with ``nodes``.
    ``mem_per_gpu_gb`` is in GB (``--mem-per-gpu 32G`` -> 32.0). ``stage_data_gb`` is the size
    of ``stage_data`` as measured by the CLI (None when unknown), used to size node-local disk.
    ``command`` is the argv that produced the request, recorded in the script's header.
    """

    cluster: str
    script: str
    script_args: tuple[str, ...] = ()
    gpus: int | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    launcher: str = "scaletrain"
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    cpus_per_gpu: int | None = None
    mem_per_gpu_gb: float | None = None
    container: str | None = None
    stage_data: str | None = None
    stage_data_gb: float | None = None
    requeue: bool = False
    device: str = "auto"
    params: float | None = None
    job_name: str | None = None
    command: tuple[str, ...] = ()
    # --profile FILE, absolute: exported as SCALETRAIN_CLUSTER so tools in the job find the same profile
    profile_file: str | None = None
    # more #SBATCH options (None: no line); every value is checked by scaletrain.plan.values
    mail_type: str | None = None
    mail_user: str | None = None
    array: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    dependency: str | None = None
    reservation: str | None = None
    qos: str | None = None
    log: str | None = None              # --output file name (default %x-%j.out)
    error_log: str | None = None        # --error file name (default: with the output)
    chdir: str | None = None            # the job's working directory (submit: where it was submitted)
    sbatch_extra: tuple[tuple[str, str], ...] = ()   # --sbatch OPTION[=VALUE], refused if it contradicts the plan
    # software set-up; each replaces or extends the profile's lines (scaletrain.plan.software)
    modules: tuple[str, ...] = ()       # --module: replaces the profile's 'module load' lines
    venv: str | None = None             # --venv DIR: source DIR/bin/activate
    conda: str | None = None            # --conda ENV: conda activate ENV
    python: str | None = None           # the interpreter that runs scaletrain on the login node
    env_origin: str | None = None       # how venv/conda/python were found (the summary says it)
    env: tuple[tuple[str, str], ...] = ()   # --env KEY=VALUE, exported before launch
    setup: tuple[str, ...] = ()         # --setup CMD: shell lines run after the set-up, as written
    # framework configs (scaletrain.plan.jobfiles): one of our strategy names (the job writes the
    # config) or the absolute path of the user's own file
    accelerate_config: str | None = None    # --accelerate-config NAME|FILE: accelerate --config_file
    deepspeed_config: str | None = None     # --deepspeed-config NAME|FILE: --deepspeed_config for the program
    precision: str = "fp32"                 # --precision: mixed precision in the generated configs
    micro_batch: int | None = None          # --micro-batch: DeepSpeed's train_micro_batch_size_per_gpu
    files_dir: str | None = None            # where the job writes those configs (submit: its run folder)
    sample_gpus: int | None = None          # --sample-gpus S: a GPU sampler per node every S s (observe.nodesampler)
    # job shapes beyond one process per GPU
    gpus_per_proc: int = 1              # --gpus-per-proc G: one process drives G GPUs (model parallel)
    procs_per_gpu: int = 1              # --procs-per-gpu K: K processes share each GPU (NVIDIA MPS)
    cpus: int | None = None             # --cpus N without GPUs: a CPU-only job, N cores per process
    expand_args: bool = False           # --expand-args: $NAME in program arguments expands on the node
    # what the program file imports (scaletrain.envs.imports; None: not readable where the request was made)
    program_imports: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        # Checked once, here: the planner and the renderer trust every value (one line + hint, exit 2).
        if self.launcher not in LAUNCHERS:
            raise UsageError(f"unknown launcher {self.launcher!r}", "use one of: " + ", ".join(LAUNCHERS))
        if self.device not in DEVICES:
            raise UsageError(f"unknown device {self.device!r}", "use --device auto or --device cpu")
        for flag, value in (("--gpus", self.gpus), ("--nodes", self.nodes),
                            ("--gpus-per-node", self.gpus_per_node), ("--cpus-per-gpu", self.cpus_per_gpu),
                            ("--cpus", self.cpus), ("--gpus-per-proc", self.gpus_per_proc),
                            ("--procs-per-gpu", self.procs_per_gpu)):
            if value is not None and value < 1:
                raise UsageError(f"{flag} must be at least 1, got {value}", f"give {flag} a positive number")
            if value is not None and value > MAX_COUNT:
                raise UsageError(f"{flag} {value} is more than {MAX_COUNT:,}", f"give {flag} a real job's size")
        if not self.script:
            raise UsageError("no training script given", "put it after '--': ... -- train.py --epochs 3")
        optional = (("--job-name", self.job_name), ("--container", self.container), ("--venv", self.venv),
                    ("--conda", self.conda), ("the job's Python", self.python), ("the run folder", self.files_dir),
                    ("--stage-data", self.stage_data), ("--profile", self.profile_file),
                    ("--accelerate-config", self.accelerate_config),
                    ("--deepspeed-config", self.deepspeed_config))
        sbatch = (("account", self.account), *((opt, getattr(self, f)) for opt, f in JOB_OPTIONS),
                  ("chdir", self.chdir), ("output", self.log), ("error", self.error_log),
                  *((name.lstrip("-"), value) for name, value in self.sbatch_extra))
        check_request_values(
            texts=[("the training script", self.script),
                   *((f"program argument {i + 1}", a) for i, a in enumerate(self.script_args)),
                   *((what, v) for what, v in optional if v), *(("--module", m) for m in self.modules),
                   *(("--setup", cmd) for cmd in self.setup)],
            env=self.env, sbatch=[(opt, v) for opt, v in sbatch if v])

    @property
    def per_node_launcher(self) -> bool:
        """True when the launcher runs one task per node (torchrun, accelerate, deepspeed)."""
        return self.launcher in PER_NODE_LAUNCHERS


def in_run_dir(request: JobRequest, run_dir: Path, *, cwd: str | None = None) -> JobRequest:
    """``request`` as submitted from ``run_dir``: the job runs where the user is (``cwd``, unless
    it names its own folder), its script's path survives any ``cd``, the files the job writes
    (framework configs) and its output go to the run folder. Reads the current folder when
    ``cwd`` is not given."""
    script = request.script
    if script != "-m":
        script = os.path.abspath(os.path.expanduser(script))
    return dataclasses.replace(request, script=script, chdir=request.chdir or cwd or os.getcwd(),
                               files_dir=str(run_dir), log=request.log or str(run_dir / JOB_LOG))


def parse_mem_gb(text: str) -> float:
    """A Slurm-style memory size (``32G``, ``32000M``, ``1T``, bare number = GB) in GB.

    Slurm's units are binary (M = MiB, G = GiB); scaletrain keeps them: 32000M = 31.25 G.
    """
    mib = parse_mem_mib(text, default_unit="G")
    if mib is None:
        raise UsageError(f"bad memory size {text!r}", "write it like 32G or 32000M")
    gb = mib / 1024
    if mib < 1:   # under 1M, Slurm's notation rounds to --mem=0: "all of the node's memory"
        raise UsageError(f"memory size {text!r} must be at least 1M", "write it like 32G or 32000M")
    return gb


def format_mem(gb: float) -> str:
    """GB to Slurm's notation: whole GB as ``320G``, otherwise MiB (``32000M``)."""
    if abs(gb - round(gb)) < 1e-9:
        return f"{int(round(gb))}G"
    # round down: rounding up could ask for a MiB more than the node has (and Slurm would refuse)
    return f"{int(gb * 1024 + 1e-6)}M"


def parse_params(text: str) -> float:
    """A parameter count: ``7e9``, ``7B``, ``350M``, ``1.3b``, ``125000000``."""
    s = str(text).strip().replace("_", "")
    m = re.match(r"^(\d+(?:\.\d+)?(?:e\d+)?)\s*([KMBT]?)$", s, re.IGNORECASE)
    if not m:
        raise UsageError(f"bad parameter count {text!r}", "write it like 7e9, 7B or 350M")
    scale = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[m.group(2).upper()]
    value = float(m.group(1)) * scale
    if not math.isfinite(value):   # 1e400 reads as inf, and int(inf) raised OverflowError later
        raise UsageError(f"parameter count {text!r} is too large", "write it like 7e9")
    if value < 1:
        raise UsageError(f"parameter count {text!r} must be at least 1", "write it like 7e9")
    return value
