"""What a cluster offers and how a job asks for it: the profile's data types, no loading.

Each field is declared once, here, as a setting of the one vocabulary (:mod:`scaletrain.settings`)
with the TOML file's options: its type, its default, what it means (``doc``), the shape its value
must have (``check``: a count, a number, one line of text...). :mod:`scaletrain.clusters.schema`
derives the TOML file's keys, their types and their checks from these declarations;
:mod:`scaletrain.clusters.profile` finds and reads the files. Nothing here imports torch.

A profile is input like any other: users share the files and ``clusters probe`` writes them from
what ``sinfo`` says. Its values reach generated batch scripts, so each field has a shape, checked
before anything is rendered. How each lands in the script:

- names and GRES types (``name``, partition names, ``gres_type``, ``scratch_gres``): one plain
  word, as Slurm spells them; they land on ``#SBATCH`` lines and in comments.
- ``master_addr_suffix``: host-name characters only; rendered in single quotes after the
  double-quoted ``$(scontrol ...)`` (never inside them, where ``$(...)`` would run).
- ``scratch_var``: a variable (``$LOCAL_SCRATCH``, ``${SLURM_TMPDIR}``) or an absolute path of
  plain characters; rendered inside double quotes so the variable expands on each node.
- ``python``: one command word (``python3``, ``/appl/bin/python``), written as the command.
- ``container`` and ``exec_wrapper``: a command with plain options (``apptainer exec --nv``),
  written as the start of the launch line.
- ``env``: variable names as bash exports them; values are single-quoted when rendered.
- ``setup_lines``, ``container_setup_lines``, ``python_env_lines``: shell code **by design**
  (``module load pytorch``, ``source $VENV/bin/activate``): written as they are, so a profile is
  trusted like a script you run. Each must be one line (no newline, NUL or other control
  character), so one entry cannot end a construct the next depends on.
- numbers: counts and finite numbers within what a node can have (``nan`` and ``inf`` are refused).
- free text (``description``, ``site``, ``gpu_model``, ``notes``, ``sources``): no control
  characters, so it cannot break a comment line or a terminal.
"""

from __future__ import annotations

import os
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable

from scaletrain.errors import ProfileError
from scaletrain.settings import (MAX_COUNT, Check, SettingError, Spec, anything, boolean, choice, count, each, line,
                                 mapping, number, rule, text, texts)
from scaletrain.slurm.parse import format_time, parse_time_seconds, parse_version  # Slurm's syntax, one parser each

__all__ = ["GPU_REQUESTS", "JOB_PACKAGES", "MEM_REQUESTS", "ClusterProfile", "Partition", "format_time",
           "parse_time"]

GPU_REQUESTS = ("gres_typed", "gres", "gpus_per_node", "gpus_per_node_typed", "gpus_per_task")
# What a GPU job is billed in, as each centre's page counts it: LUMI "GPU-hours" (one MI250X for an
# hour); the Alliance "bundles" (RGU-core-memory bundles, one per GPU, each worth the GPU's RGUs);
# CSC "GPU BU" (billing units, a rate per GPU-hour); JSC "core-h" (its allocation page: quota
# "assigned in core-h"; the rate is the node's cores per GPU, a reading its pages do not confirm)
BILLING_UNITS = ("GPU-hours", "bundles", "GPU BU", "core-h")
MEM_REQUESTS = ("proportional", "whole_node", "none")
# In ``python_env_lines``: the wheels the job's venv installs (torch, or the launcher's framework)
JOB_PACKAGES = "@PACKAGES@"
# ``absent`` for ``name``: a file without one is named by its file name
FILE_STEM = "file stem"

# Upper bounds well above any machine (a 16-GPU node, 100 TB of memory) that still catch a slip of
# the keyboard before it becomes a plan with 10^20 GPUs; every other count has the settings' cap.
MAX_GPUS_PER_NODE = 1024
MAX_GB = 1e8
# The shapes of the profile's words, as they land in a script (see the module docstring).
WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
HOST_SUFFIX = re.compile(r"[A-Za-z0-9.-]*")
SCRATCH = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})|/[A-Za-z0-9_.+/-]*")
# a command or an image never starts with '-': a first word the shell would pass as an option
COMMAND_WORD = re.compile(r"[A-Za-z0-9_./+][A-Za-z0-9_./+-]*")
COMMAND = re.compile(r"[A-Za-z0-9_./+][A-Za-z0-9_./+-]*( +[A-Za-z0-9_./+=:,-]+)*")
IMAGE = re.compile(r"[A-Za-z0-9_./:@+][A-Za-z0-9_./:@+-]*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class ProfileSettingError(SettingError, ProfileError):
    """A profile value its fact refuses: the settings' one line, naming the file and the field."""


@dataclass(frozen=True)
class Toml:
    """How a profile file sets a fact. ``file``: the file may set it (``path`` is set by the
    loader); ``absent``: what a file that leaves it out gets when that is not the default (a
    function of the fields read before it); ``read``: how the file's value becomes the field's
    (``cores_per_node = 0``: this machine's)."""

    file: bool = True
    absent: Any = None
    read: Callable[[Any], Any] | None = None


def fact(doc: str, *, default: Any = MISSING, factory: Callable[[], Any] | None = None,
         check: Check | None = None, toml: bool = True, absent: Any = None,
         read: Callable[[Any], Any] | None = None) -> Any:
    """One profile field: a setting (``doc``, what it means; ``check``, the shape of its value, from
    :mod:`scaletrain.settings`) with the TOML file's options (:class:`Toml`). A field without a
    default must be in the file."""
    spec = Spec(doc=doc, check=check or anything(), optional=default is None, error=ProfileSettingError)
    meta = {"setting": spec, "toml": Toml(file=toml, absent=absent, read=read)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def parse_time(text: str) -> int:
    """Slurm time ``[D-]HH:MM:SS`` (also ``MM``, ``MM:SS``, ``D-HH``, ``D-HH:MM``) to seconds."""
    try:
        seconds = parse_time_seconds(str(text))
    except ValueError:
        seconds = None
    if seconds is None:  # malformed, or a limit word such as UNLIMITED where a time is needed
        raise ProfileError(f"bad time {str(text).strip()!r}",
                           "write it as HH:MM:SS or D-HH:MM:SS, e.g. 01:30:00")
    return seconds


def _slurm_time(value: Any) -> bool:
    try:
        return not value or parse_time_seconds(str(value)) is not None
    except ValueError:
        return False


def usable_cores() -> int:
    """The cores this process may use (a cgroup or taskset narrows them), not the whole box."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


_TEXT = line()
_LINES = texts(empty_ok=True)
_COUNT = count(0, MAX_COUNT)
_GB = number(low=0, high=MAX_GB)
_BOOL = boolean()
_WORD = text(pattern=WORD, shape="a plain name (letters, digits, _ . + -)")
_TIME = rule(_slurm_time, 'a time limit, "HH:MM:SS" or "D-HH:MM:SS"')
_DAY = rule(lambda v: not v or (isinstance(v, str) and _DATE.fullmatch(v) is not None), "a date YYYY-MM-DD")
_COMMAND = "a command with plain options, e.g. '{}'"


@dataclass(frozen=True, kw_only=True)
class Partition:
    """One Slurm partition and the limits a plan must respect."""

    name: str = fact("the partition's name (its table's key in the file)", toml=False)
    gpus: bool = fact("a GPU partition", default=True, check=_BOOL)
    max_gpus: int | None = fact("GPUs per job at most (Mahti gpusmall: 2; Roihu gpumedium: 4)", default=None,
                                check=_COUNT)
    min_gpus: int | None = fact("GPUs per job at least (Roihu gpularge: 4)", default=None, check=_COUNT)
    max_nodes: int | None = fact("nodes per job at most", default=None, check=_COUNT)
    min_nodes: int | None = fact("nodes per job at least", default=None, check=_COUNT)
    max_nodes_no_allocation: int | None = fact(
        "the node limit for an account without an allocation (Trillium: 5 on a def- account, 25 with a RAC "
        "allocation); which accounts have none: ClusterProfile.no_allocation_accounts", default=None, check=_COUNT)
    cores_per_node: int | None = fact("the partition's nodes, when not the profile's (LUMI-C small: 128)",
                                      default=None, check=count(1, MAX_COUNT))
    whole_node: bool = fact("only whole nodes are allocated (LUMI standard-g)", default=False, check=_BOOL)
    max_time: str | None = fact('the time limit, "HH:MM:SS" or "D-HH:MM:SS"', default=None, check=_TIME)
    default: bool = fact("the partition a job gets when it names none", default=False, check=_BOOL)
    # additions beyond the shared contract
    test: bool = fact("a short test/debug queue: chosen only when named", default=False, check=_BOOL)
    implicit: bool = fact("the scheduler routes jobs itself: no --partition line", default=False, check=_BOOL)
    description: str = fact("what the partition is for", default="", check=_TEXT)
    access: str = fact("a condition for using it, said in the plan (Roihu gpularge)", default="", check=_TEXT)

    @property
    def max_seconds(self) -> int | None:
        """``max_time`` in seconds, or None when the partition has no limit."""
        return parse_time(self.max_time) if self.max_time else None


@dataclass(frozen=True, kw_only=True)
class ClusterProfile:
    """Everything scaletrain knows about one cluster (see the module docstring for the source)."""

    name: str = fact("the cluster's name, as --cluster takes it", absent=FILE_STEM,
                     check=_WORD)
    description: str = fact("the cluster in a few words", default="", check=_TEXT)
    site: str = fact("the centre that runs it", default="", check=_TEXT)
    gpus_per_node: int = fact("GPUs per node (0: a CPU-only machine)",
                              check=count(0, MAX_GPUS_PER_NODE))
    gpu_model: str = fact("the GPU's model, in words", default="", check=_TEXT)
    gpu_memory_gb: float = fact("one GPU's memory, GB", default=0.0, check=_GB)
    gpu_vendor: str = fact('"nvidia" | "amd" | "none"', default="nvidia", check=choice(("nvidia", "amd", "none")))
    cores_per_node: int = fact("cores a job may use per node (0 in the file: this machine's, for the local profile)",
                               read=lambda n: n or usable_cores(),
                               check=count(1, MAX_COUNT))
    mem_per_node_gb: float = fact("memory a job may request per node, GB", check=_GB)
    partitions: dict[str, Partition] = fact(
        "the partitions, in file order ([partitions.NAME] tables)", factory=dict,
        check=mapping(key=text(pattern=WORD, shape="a partition name (letters, digits, _ . + -)")))
    gpu_request: str = fact('how a job asks for GPUs: "gres_typed" | "gres" | "gpus_per_node" | '
                            '"gpus_per_node_typed" | "gpus_per_task"', default="gres", check=choice(GPU_REQUESTS))
    gres_type: str | None = fact('the GPUs\' GRES type: "v100", "a100", ...', default=None,
                                 check=text(pattern=WORD, shape="a GRES type such as v100"))
    account_required: bool = fact("a job must name the project billed (--account)", default=False, check=_BOOL)
    scratch_var: str | None = fact('node-local scratch: "$LOCAL_SCRATCH", "$SLURM_TMPDIR", "$TMPDIR"', default=None,
                                   check=text(pattern=SCRATCH, shape="a variable such as '$LOCAL_SCRATCH' or an "
                                              "absolute path of plain characters"))
    setup_lines: tuple[str, ...] = fact("shell lines that set up the software (module loads etc.)", default=(),
                                        check=_LINES)
    container: str | None = fact("the wrapper command for containers, or None", default=None,
                                 check=text(pattern=COMMAND, shape=_COMMAND.format("apptainer exec --nv")))
    env: dict[str, str] = fact('exported in every job, e.g. {"NCCL_SOCKET_IFNAME": "hsn"} on LUMI', factory=dict,
                               check=mapping(key=text(pattern=ENV_NAME, shape="a variable name (letters, digits "
                                                      "and _)"), value=_TEXT))
    master_addr_suffix: str = fact('"i" on JUWELS (InfiniBand host names), else ""', default="",
                                   check=line(pattern=HOST_SUFFIX, shape="host-name characters (letters, digits, "
                                              "'.' and '-'), e.g. 'i'"))
    gpu_cpu_map: dict[int, tuple[int, ...]] | None = fact(
        "GPU index -> its nearest cores (LUMI GCD->CCD)", default=None,
        check=mapping(key=count(0, MAX_GPUS_PER_NODE), value=each(count(0, MAX_COUNT))))
    intra_node_gbps: float | None = fact("Gbit/s between two GPUs of a node (peak, per GPU)", default=None,
                                         check=_GB)
    inter_node_gbps: float | None = fact("Gbit/s between nodes (peak, per node, all NICs)", default=None, check=_GB)
    sources: tuple[str, ...] = fact("where the values came from (seed file or centre doc URL)", default=(),
                                    check=_LINES)
    # additions beyond the shared contract
    scheduler: str = fact('"slurm" | "none" (the local machine)', default="slurm", check=choice(("slurm", "none")))
    slurm_version: str | None = fact(
        'the Slurm release the cluster runs ("23.11" or "23.11.4"), from the centre\'s page or `sinfo --version` '
        "(clusters check); None: unknown, and lint's version-dependent rules stay quiet", default=None,
        check=rule(lambda v: isinstance(v, str) and parse_version(v) is not None,
                   "a Slurm version such as '23.11' or '23.11.4'"))
    python: str = fact("the interpreter the set-up lines provide", default="python3",
                       check=text(pattern=COMMAND_WORD, shape="one command word such as python3 or /appl/bin/python"))
    mem_request: str = fact('"proportional" | "whole_node" (--mem=0) | "none" (no --mem)', default="proportional",
                            check=choice(MEM_REQUESTS))
    mem_per_gpu_gb: float | None = fact("the per-GPU memory share to request; None: mem_per_node/gpus",
                                        default=None, check=_GB)
    gpu_request_accepts: tuple[str, ...] = fact(
        "every GPU syntax the cluster takes (for lint); a file without it: gpu_request's", default=(),
        absent=lambda read: (read["gpu_request"],), check=each(choice(GPU_REQUESTS)))
    exec_wrapper: str | None = fact("prefix for launchers the module does not wrap (deepspeed)", default=None,
                                    check=text(pattern=COMMAND, shape=_COMMAND.format("apptainer_wrapper exec")))
    scratch_gres: str | None = fact('the GRES that buys node-local disk ("nvme" on Puhti/Mahti)', default=None,
                                    check=text(pattern=WORD, shape="a GRES name such as nvme"))
    scratch_max_gb: float | None = fact("node-local disk a job may fill, as the centre states it (Roihu: 150 GiB "
                                        "per user)", default=None, check=_GB)
    scratch_in_memory: bool = fact('node-local "scratch" is a RAM disk (LUMI-G /tmp): no NVMe offload',
                                   default=False, check=_BOOL)
    default_time: str = fact("the time limit a job gets when it names none", default="01:00:00", check=_TIME)
    notes: tuple[str, ...] = fact("what a user of the cluster should know", default=(), check=_LINES)
    path: str = fact("the file the profile was read from", default="", toml=False)
    # the centre's per-GPU share of a shared node, and what happens beyond it (clusters/resources.py)
    max_cores_per_gpu: int | None = fact("cores per GPU within the share", default=None, check=count(1, MAX_COUNT))
    max_mem_per_gpu_gb: float | None = fact("memory per GPU within the share, GB", default=None, check=_GB)
    gpu_share_policy: str = fact('"enforced": refused beyond the share; "billed": charged for it',
                                 default="billed", check=choice(("enforced", "billed")))
    billing: str = fact('"gpus": GPU x hours; "max_share": max(GPUs, cores/share, mem/share)', default="gpus",
                        check=choice(("gpus", "max_share")))
    billing_unit: str = fact("what the centre bills a GPU job in, in its page's words: " + " | ".join(BILLING_UNITS),
                             default="GPU-hours", check=choice(BILLING_UNITS))
    billing_rate: float | None = fact("the billing unit's worth per billed GPU-hour: the RGUs of one GPU's bundle "
                                      "(Alliance H100: 12.2), the BUs of a GPU-hour (Roihu: 200), the core-h of a "
                                      "GPU-hour (JUPITER: 72)", default=None,
                                      check=_GB)
    # containers: what `apptainer exec` needs on this cluster (bind mounts, set-up before it)
    container_binds: tuple[str, ...] = fact("bind mounts for the container", default=(), check=_LINES)
    container_setup_lines: tuple[str, ...] = fact("shell lines run before the container", default=(),
                                                  check=_LINES)
    python_env_lines: tuple[str, ...] = fact(
        "the Python environment a job gets when it names none (--venv/--conda): e.g. a virtualenv built on each "
        "node from the centre's wheels (Alliance)", default=(), check=_LINES)
    software: str = fact('the job\'s software by default: "module" (the centre\'s modules) | "container" '
                         '(default_image run with the ``container`` wrapper: LUMI AI Factory images)',
                         default="module", check=choice(("module", "container")))
    default_image: str | None = fact("the image a job gets when it names none", default=None,
                                     check=text(pattern=IMAGE, shape="an image path or URI of plain characters, "
                                                "e.g. /appl/local/containers/pytorch.sif"))
    cpu_arch: str = fact('"x86_64" | "aarch64" (GH200 (Grace) nodes: one CPU per GPU)', default="x86_64",
                         check=choice(("x86_64", "aarch64")))
    module_multinode_warning: str = fact("said when a multi-node job uses the modules (LUMI: CSC's module)",
                                         default="", check=_TEXT)
    tensorflow_setup_lines: tuple[str, ...] = fact("the centre's TensorFlow set-up (CSC: module load tensorflow)",
                                                   default=(), check=_LINES)
    missing_launchers: dict[str, str] = fact("launcher -> why the centre's software lacks it", factory=dict,
                                             check=mapping(key=_TEXT, value=_TEXT))
    cpu_mem_per_core_gb: float | None = fact("CPU-only jobs: the CPU nodes' memory per core", default=None, check=_GB)
    gpus_per_billing_unit: int = fact("GPUs in one billed GPU-hour (LUMI: 2 GCDs = one MI250X)", default=1,
                                      check=count(1, MAX_GPUS_PER_NODE))
    gpus_per_node_allowed: tuple[int, ...] = fact(
        "the only per-node GPU counts taken (Trillium: 1, 4)", default=(), check=each(count(1, MAX_GPUS_PER_NODE)))
    no_allocation_accounts: tuple[str, ...] = fact(
        'account prefixes without an allocation (Alliance: "def-")', default=(),
        check=each(text(pattern=WORD, shape="an account prefix such as def-")))
    cpu_jobs: str = fact("where CPU-only jobs go when this profile's nodes take none", default="", check=_TEXT)
    wheels: dict[str, str] = fact(
        "framework -> its pip name in the centre's wheelhouse (the Alliance: tensorflow, horovod), installed with "
        "--no-index into the job's venv (python_env_lines) or by 'env create --with'", factory=dict,
        check=mapping(key=text(pattern=WORD, shape="a framework name such as tensorflow"),
                      value=text(pattern=WORD, shape="a pip package name such as tensorflow")))
    # provenance: the date the centre's documentation was read, each fact's source, and the
    # facts that could not be confirmed ("FIELD: why"; FIELD as in the file, partitions.NAME.KEY)
    checked: str = fact("the date the centre's documentation was read, YYYY-MM-DD", default="", check=_DAY)
    facts: dict[str, str] = fact("FIELD -> the source of its value", factory=dict,
                                 check=mapping(key=_TEXT, value=_TEXT))
    unconfirmed: tuple[str, ...] = fact(
        '"FIELD: why" for each fact no document confirmed', default=(),
        check=each(rule(lambda e: isinstance(e, str) and ":" in e, "'FIELD: why it is unconfirmed'")))
    # a system that no longer takes jobs: kept so lint can read old scripts
    retired: str | None = fact("the date it stopped taking jobs, YYYY-MM-DD", default=None, check=_DAY)
    successor: str | None = fact("the profile to port scripts to", default=None,
                                 check=text(pattern=WORD, shape="a profile name such as roihu"))

    @property
    def unconfirmed_facts(self) -> dict[str, str]:
        """FIELD -> why it is unconfirmed, from the ``unconfirmed`` list."""
        out: dict[str, str] = {}
        for entry in self.unconfirmed:
            key, _, why = entry.partition(":")
            out[key.strip()] = why.strip()
        return out

    @property
    def cores_per_gpu(self) -> int:
        """The node's usable cores shared per GPU (Puhti 10, Mahti 32, LUMI 7)."""
        return max(1, self.cores_per_node // max(1, self.gpus_per_node))

    @property
    def mem_per_gpu(self) -> float:
        """The memory share per GPU, in GB."""
        if self.mem_per_gpu_gb is not None:
            return self.mem_per_gpu_gb
        return self.mem_per_node_gb / max(1, self.gpus_per_node)

    @property
    def default_partition(self) -> Partition | None:
        """The partition marked ``default`` (else the first GPU partition)."""
        for part in self.partitions.values():
            if part.default:
                return part
        gpu = [p for p in self.partitions.values() if p.gpus]
        return gpu[0] if gpu else None

    def partition(self, name: str) -> Partition:
        """The partition ``name``, or ProfileError listing the known ones."""
        try:
            return self.partitions[name]
        except KeyError:
            known = ", ".join(self.partitions) or "(none)"
            raise ProfileError(
                f"unknown partition {name!r} on cluster {self.name!r} (known: {known})",
                f"use one of: {known}, or leave --partition out to let scaletrain choose",
            ) from None


def _unknown_named(profile: ClusterProfile) -> str | None:
    known = {f.name for f in fields(ClusterProfile) if f.metadata["toml"].file}
    named = [*profile.facts, *(e.partition(":")[0].strip() for e in profile.unconfirmed)]
    bad = [key for key in named if key.split(".", 1)[0] not in known]
    return f"facts/unconfirmed name {bad[0]!r}, which is not a profile field" if bad else None


# The rules between fields, checked after each field's own ``check``: each says what is wrong
# with the profile read, or None.
RULES: tuple[Callable[[ClusterProfile], str | None], ...] = (
    lambda p: "gpu_request 'gres_typed' needs gres_type (e.g. 'v100')"
    if p.gpu_request == "gres_typed" and not p.gres_type else None,
    lambda p: "software 'container' needs default_image (the image a job gets when it names none)"
    if p.software == "container" and not p.default_image else None,
    _unknown_named,
    lambda p: "successor goes with retired (the date the system stopped taking jobs)"
    if p.successor and not p.retired else None,
    # a plan would count GPUs the script never requests (issue 39, item 7)
    lambda p: f"gpus_per_node = 0 says the nodes have no GPU, but gpu_vendor is {p.gpu_vendor!r} "
    "(a CPU-only cluster has gpu_vendor = \"none\")"
    if p.gpus_per_node == 0 and p.gpu_vendor != "none" else None,
)
