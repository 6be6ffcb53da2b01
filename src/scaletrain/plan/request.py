"""What the user asked for: a ``JobRequest``, and the parsing of its flag values.

The request is plain data, validated once when it is made (``JobRequest.__post_init__``): every
value it carries to a script, its counts, its launcher and device, the ``--sbatch`` option names and
what ``--expand-args`` would expand. ``scaletrain plan`` and ``scaletrain submit`` build it from the
same flags (``scaletrain.cli.plan.add_plan_arguments`` / ``request_from_args``); the planner's stages
(``scaletrain.plan.planner``) trust it and turn it and a cluster profile into a ``Plan`` without any
I/O, checking only what depends on the cluster.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from scaletrain.errors import PlanError, UsageError
from scaletrain.parallel.options import PRECISIONS
from scaletrain.plan.values import SBATCH_SHAPES, check_request_values
from scaletrain.settings import (Bad, boolean, check_fields, choice, count, number, operand, operands, pairs, setting,
                                 text, texts)
from scaletrain.slurm.parse import parse_mem_mib, parse_time_seconds

# Launch modes and their facts live in one table (scaletrain.plan.launchers).
from scaletrain.plan.launchers import LAUNCHERS, SPECS

PER_NODE_LAUNCHERS: frozenset[str] = frozenset(n for n, s in SPECS.items() if s.per_node)
DEVICES: tuple[str, ...] = ("auto", "cpu")
# A pip requirement the job's venv may install (``wheels``): a name, an extra, an exact version;
# it is written into the job's shell line, so nothing in it is special to the shell.
WHEEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?(==[A-Za-z0-9.*+!_-]+)?")
MIN_MEM_GB = 1 / 1024     # 1M: a smaller size renders as --mem=0, which Slurm reads as the whole node
MAX_MEM_GB = 64 * 1024.0  # 64 TiB per GPU
MAX_PARAMS = 1e15         # a quadrillion parameters
MAX_TIME_S = 365 * 86400  # a year: no partition allows more
_TEXT = text()


def _wheels(value: object) -> tuple[str, ...]:
    """Package names (with an optional ==version) pip can install in the job's venv; nothing a shell reads."""
    names = texts()(value)
    if any(not WHEEL_RE.fullmatch(w) for w in names):
        raise Bad("a list of pip package names such as torchvision or torchvision==0.20.1")
    return names


_COUNT = count()
# a value that lands on the job's command lines as a word of its own (a module, an environment, an
# image, an interpreter, a path): never one that starts with '-', which the command reads as an option
_OPERAND = operand()


_ARGS = texts(empty_ok=True, control_ok=True)   # program arguments: checked for the script below
_PARTITION = text(pattern=SBATCH_SHAPES["partition"][0], shape=SBATCH_SHAPES["partition"][1])


def _time(value: object) -> str:
    """A Slurm time limit above 0 and at most a year (``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``)."""
    shape = "a time limit above 0 and at most 365 days, written HH:MM:SS or D-HH:MM:SS"
    if not isinstance(value, str):
        raise Bad(shape)
    try:
        seconds = parse_time_seconds(value)
    except ValueError:
        seconds = None
    if seconds is None or not 0 < seconds <= MAX_TIME_S:
        raise Bad(shape)
    return value.strip()


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

    cluster: str = setting("the cluster profile's name", check=_TEXT, flag="--cluster")
    script: str = setting("the training script (or -m)", check=_TEXT)
    script_args: tuple[str, ...] = setting("the program's arguments", default=(), check=_ARGS)
    gpus: int | None = setting("total GPUs", default=None, check=_COUNT, flag="--gpus")
    nodes: int | None = setting("number of nodes", default=None, check=_COUNT, flag="--nodes")
    gpus_per_node: int | None = setting("GPUs per node with nodes", default=None, check=_COUNT,
                                        flag="--gpus-per-node")
    launcher: str = setting("how the processes start", default="scaletrain", check=choice(LAUNCHERS),
                            flag="--launcher")
    partition: str | None = setting("the Slurm partition", default=None, check=_PARTITION, flag="--partition")
    time: str | None = setting("the time limit, HH:MM:SS or D-HH:MM:SS", default=None, check=_time,
                               flag="--time")
    account: str | None = setting("the project/account to bill", default=None, check=_TEXT, flag="--account")
    cpus_per_gpu: int | None = setting("cores per GPU", default=None, check=_COUNT, flag="--cpus-per-gpu")
    # at least 1 MiB: Slurm reads --mem=0 as "all of the node's memory"
    mem_per_gpu_gb: float | None = setting("memory per GPU", default=None, unit="GB", flag="--mem-per-gpu",
                                           check=number(low=MIN_MEM_GB, high=MAX_MEM_GB))
    container: str | None = setting("an Apptainer/Singularity image", default=None, check=_OPERAND,
                                    flag="--container")
    stage_data: str | None = setting("a dataset copied to node-local disk", default=None, check=_OPERAND,
                                     flag="--stage-data")
    stage_data_gb: float | None = setting("the size of stage_data, as measured", default=None, unit="GB",
                                          check=number(low=0))
    requeue: bool = setting("requeue on preemption or time limit", default=False, check=boolean(),
                            flag="--requeue")
    device: str = setting("auto or cpu", default="auto", check=choice(DEVICES), flag="--device")
    params: float | None = setting("model size in parameters", default=None, flag="--params",
                                   check=number(low=1, high=MAX_PARAMS))
    job_name: str | None = setting("the Slurm job name", default=None, check=_TEXT, flag="--job-name")
    command: tuple[str, ...] = setting("the argv that produced the request", default=(), check=_ARGS)
    # --profile FILE, absolute: exported as SCALETRAIN_CLUSTER so tools in the job find the same profile
    profile_file: str | None = setting("a cluster profile file", default=None, check=_TEXT, flag="--profile")
    # more #SBATCH options (None: no line); every value is checked by scaletrain.plan.values
    mail_type: str | None = setting("sbatch --mail-type", default=None, check=_TEXT, flag="--mail-type")
    mail_user: str | None = setting("sbatch --mail-user", default=None, check=_TEXT, flag="--mail-user")
    array: str | None = setting("sbatch --array", default=None, check=_TEXT, flag="--array")
    constraint: str | None = setting("sbatch --constraint", default=None, check=_TEXT, flag="--constraint")
    exclusive: bool = setting("whole nodes for this job only", default=False, check=boolean(),
                              flag="--exclusive")
    dependency: str | None = setting("sbatch --dependency", default=None, check=_TEXT, flag="--dependency")
    reservation: str | None = setting("sbatch --reservation", default=None, check=_TEXT, flag="--reservation")
    qos: str | None = setting("sbatch --qos", default=None, check=_TEXT, flag="--qos")
    log: str | None = setting("the --output file name (default %x-%j.out)", default=None, check=_TEXT,
                              flag="--log")
    error_log: str | None = setting("the --error file name (default: with the output)", default=None,
                                    check=_TEXT, flag="--error")
    chdir: str | None = setting("the job's working directory", default=None, check=_TEXT, flag="--chdir")
    sbatch_extra: tuple[tuple[str, str], ...] = setting(   # refused if it contradicts the plan
        "more sbatch options, OPTION[=VALUE]", default=(), check=pairs(), flag="--sbatch")
    # software set-up; each replaces or extends the profile's lines (scaletrain.plan.software)
    modules: tuple[str, ...] = setting("modules to load (replaces the profile's)", default=(), check=operands(),
                                       flag="--module")
    venv: str | None = setting("a virtualenv to activate", default=None, check=_OPERAND, flag="--venv")
    conda: str | None = setting("a conda environment to activate", default=None, check=_OPERAND, flag="--conda")
    python: str | None = setting("the interpreter that runs scaletrain on the login node", default=None,
                                 check=_OPERAND)
    env_origin: str | None = setting("how venv/conda/python were found", default=None, check=_TEXT)
    env: tuple[tuple[str, str], ...] = setting("variables exported before launch", default=(), check=pairs(),
                                               flag="--env")
    setup: tuple[str, ...] = setting("shell lines run after the set-up", default=(), check=texts(),
                                     flag="--setup")
    wheels: tuple[str, ...] = setting("pip names the job's own venv installs besides torch (port: the old venv's)",
                                     default=(), check=_wheels)
    # framework configs (scaletrain.plan.jobfiles): one of our strategy names (the job writes the
    # config) or the absolute path of the user's own file
    accelerate_config: str | None = setting("accelerate --config_file: a strategy name or a file", default=None,
                                            check=_OPERAND, flag="--accelerate-config")
    deepspeed_config: str | None = setting("--deepspeed_config: a strategy name or a file", default=None,
                                           check=_OPERAND, flag="--deepspeed-config")
    precision: str = setting("mixed precision in the generated configs", default="fp32",
                             check=choice(PRECISIONS), flag="--precision")
    micro_batch: int | None = setting("DeepSpeed's train_micro_batch_size_per_gpu", default=None, check=_COUNT,
                                      flag="--micro-batch")
    files_dir: str | None = setting("where the job writes its configs (submit: the run folder)", default=None,
                                    check=_TEXT)
    sample_gpus: int | None = setting("a GPU sampler per node every S seconds", default=None, unit="seconds",
                                      check=count(1, 3600), flag="--sample-gpus")
    # job shapes beyond one process per GPU
    gpus_per_proc: int = setting("GPUs one process drives", default=1, check=_COUNT, flag="--gpus-per-proc")
    procs_per_gpu: int = setting("processes sharing each GPU (NVIDIA MPS)", default=1, check=_COUNT,
                                 flag="--procs-per-gpu")
    cpus: int | None = setting("a CPU-only job: cores per process", default=None, check=_COUNT, flag="--cpus")
    expand_args: bool = setting("$NAME in program arguments expands on the node", default=False,
                                check=boolean(), flag="--expand-args")
    program_imports: tuple[str, ...] | None = setting(
        "what the program file imports (scaletrain.envs.imports; None: not readable where the request was made)",
        default=None, check=texts())

    def __post_init__(self) -> None:
        # Checked once, here: the planner and the renderer trust every value (one line + hint, exit 2).
        if not isinstance(self.script, str) or not self.script:
            raise UsageError("no training script given", "put it after '--': ... -- train.py --epochs 3")
        if self.script != "-m" and self.script.lstrip().startswith("-"):   # -m MODULE: the option we write
            raise UsageError(f"the training script {self.script[:40]!r} starts with '-': python would read it as "
                             "an option (-c CODE runs CODE)", "give the script's path (./-x.py for a file named "
                             "so), or -m MODULE")
        check_fields(self)    # each field's declaration (type, range, choices), naming its flag
        if self.script == "-m" and not (self.script_args and self.script_args[0].strip()
                                        and not self.script_args[0].lstrip().startswith("-")):
            raise UsageError(f"-m needs a module name, got {(self.script_args or ('nothing',))[0]!r}",
                             "name the module after -m: ... -- -m mypackage.train --epochs 3")
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
            env=self.env, sbatch=[(opt, v) for opt, v in sbatch if v], extra=self.sbatch_extra,
            expanding=(self.script, *self.script_args) if self.expand_args else ())

    @property
    def per_node_launcher(self) -> bool:
        """True when the launcher runs one task per node (torchrun, accelerate, deepspeed)."""
        return self.launcher in PER_NODE_LAUNCHERS

    @property
    def slurm_job_name(self) -> str:
        """The job's name: ``--job-name``, else the training script's file stem made Slurm-safe
        (the ``#SBATCH --job-name`` line, and the name of submit's run folder)."""
        if self.job_name:
            return self.job_name
        stem = self.script.rsplit("/", 1)[-1]
        for ext in (".py", ".sh"):
            if stem.endswith(ext):
                stem = stem[: -len(ext)]
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem) or "scaletrain"


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
    """GB to Slurm's notation: whole GB as ``320G``, otherwise MiB (``32000M``).

    Never ``0`` or negative: Slurm reads ``--mem=0`` as all of the node's memory, so a size that
    rounds to under 1M (a profile's share of 0, NaN) is a PlanError, not a line.
    """
    if not gb * 1024 >= 1 - 1e-6 or not math.isfinite(gb):
        raise PlanError(f"a memory size of {gb!r} GB is under 1M: Slurm would read the --mem line as "
                        "all of the node's memory", "give at least 1M per GPU (--mem-per-gpu), or fix the "
                        "profile's memory figures")
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
