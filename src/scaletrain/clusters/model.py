"""What a cluster offers and how a job asks for it: the profile's data types, no loading.

Each field is declared once, here: its type, its default, what it means (``doc``) and the shape its
value must have (``check``, from :mod:`scaletrain.clusters.validate`). :mod:`scaletrain.clusters.schema`
derives the TOML file's keys, their types and their checks from these declarations;
:mod:`scaletrain.clusters.profile` finds and reads the files. Nothing here imports torch.
"""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable

from scaletrain.clusters.validate import (MAX_CORES_PER_NODE, MAX_COUNT, MAX_GB, MAX_GPUS_PER_NODE, Check,
                                          COMMAND, COMMAND_WORD, ENV_NAME, HOST_SUFFIX, IMAGE, SCRATCH, WORD,
                                          date, each, line, mapping, number, one_of, parse_time, pattern,
                                          rule, slurm_time)
from scaletrain.errors import ProfileError
from scaletrain.slurm.parse import format_time, parse_version  # Slurm's syntax, one parser each

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


def fact(doc: str, *, default: Any = MISSING, factory: Callable[[], Any] | None = None,
         check: Check | None = None, toml: bool = True, absent: Any = None,
         read: Callable[[Any], Any] | None = None) -> Any:
    """One profile field: its default, ``doc`` (what it means), ``check`` (the shape of its value).

    ``toml``: the file may set it (``path`` is set by the loader); ``absent``: what a file that
    leaves it out gets when that is not the default (a function of the fields read before it);
    ``read``: how the file's value becomes the field's (``cores_per_node = 0``: this machine's).
    A field without a default must be in the file.
    """
    meta = {"doc": doc, "check": check, "toml": toml, "absent": absent, "read": read}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def usable_cores() -> int:
    """The cores this process may use (a cgroup or taskset narrows them), not the whole box."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


_TEXT = line()
_LINES = each(line())
_COUNT = number(0, MAX_COUNT)
_GB = number(0, MAX_GB)
_COMMAND = "a command with plain options, e.g. '{}'"


@dataclass(frozen=True, kw_only=True)
class Partition:
    """One Slurm partition and the limits a plan must respect."""

    name: str = fact("the partition's name (its table's key in the file)", toml=False)
    gpus: bool = fact("a GPU partition", default=True)
    max_gpus: int | None = fact("GPUs per job at most (Mahti gpusmall: 2; Roihu gpumedium: 4)", default=None,
                                check=_COUNT)
    min_gpus: int | None = fact("GPUs per job at least (Roihu gpularge: 4)", default=None, check=_COUNT)
    max_nodes: int | None = fact("nodes per job at most", default=None, check=_COUNT)
    min_nodes: int | None = fact("nodes per job at least", default=None, check=_COUNT)
    max_nodes_no_allocation: int | None = fact(
        "the node limit for an account without an allocation (Trillium: 5 on a def- account, 25 with a RAC "
        "allocation); which accounts have none: ClusterProfile.no_allocation_accounts", default=None, check=_COUNT)
    cores_per_node: int | None = fact("the partition's nodes, when not the profile's (LUMI-C small: 128)",
                                      default=None, check=number(1, MAX_CORES_PER_NODE))
    whole_node: bool = fact("only whole nodes are allocated (LUMI standard-g)", default=False)
    max_time: str | None = fact('the time limit, "HH:MM:SS" or "D-HH:MM:SS"', default=None, check=slurm_time())
    default: bool = fact("the partition a job gets when it names none", default=False)
    # additions beyond the shared contract
    test: bool = fact("a short test/debug queue: chosen only when named", default=False)
    implicit: bool = fact("the scheduler routes jobs itself: no --partition line", default=False)
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
                     check=pattern(WORD, "a plain name (letters, digits, _ . + -)", empty_ok=False))
    description: str = fact("the cluster in a few words", default="", check=_TEXT)
    site: str = fact("the centre that runs it", default="", check=_TEXT)
    gpus_per_node: int = fact("GPUs per node (0: a CPU-only machine)",
                              check=number(0, MAX_GPUS_PER_NODE, none_ok=False))
    gpu_model: str = fact("the GPU's model, in words", default="", check=_TEXT)
    gpu_memory_gb: float = fact("one GPU's memory, GB", default=0.0, check=number(0, MAX_GB, none_ok=False))
    gpu_vendor: str = fact('"nvidia" | "amd" | "none"', default="nvidia", check=one_of(("nvidia", "amd", "none")))
    cores_per_node: int = fact("cores a job may use per node (0 in the file: this machine's, for the local profile)",
                               read=lambda n: n or usable_cores(),
                               check=number(1, MAX_CORES_PER_NODE, none_ok=False))
    mem_per_node_gb: float = fact("memory a job may request per node, GB", check=number(0, MAX_GB, none_ok=False))
    partitions: dict[str, Partition] = fact(
        "the partitions, in file order ([partitions.NAME] tables)", factory=dict,
        check=mapping(key=pattern(WORD, "a partition name (letters, digits, _ . + -)", empty_ok=False)))
    gpu_request: str = fact('how a job asks for GPUs: "gres_typed" | "gres" | "gpus_per_node" | '
                            '"gpus_per_node_typed" | "gpus_per_task"', default="gres", check=one_of(GPU_REQUESTS))
    gres_type: str | None = fact('the GPUs\' GRES type: "v100", "a100", ...', default=None,
                                 check=pattern(WORD, "a GRES type such as v100"))
    account_required: bool = fact("a job must name the project billed (--account)", default=False)
    scratch_var: str | None = fact('node-local scratch: "$LOCAL_SCRATCH", "$SLURM_TMPDIR", "$TMPDIR"', default=None,
                                   check=pattern(SCRATCH, "a variable such as '$LOCAL_SCRATCH' or an absolute "
                                                 "path of plain characters"))
    setup_lines: tuple[str, ...] = fact("shell lines that set up the software (module loads etc.)", default=(),
                                        check=_LINES)
    container: str | None = fact("the wrapper command for containers, or None", default=None,
                                 check=pattern(COMMAND, _COMMAND.format("apptainer exec --nv")))
    env: dict[str, str] = fact('exported in every job, e.g. {"NCCL_SOCKET_IFNAME": "hsn"} on LUMI', factory=dict,
                               check=mapping(key=pattern(ENV_NAME, "a variable name (letters, digits and _)",
                                                         empty_ok=False), value=_TEXT, per_key=True))
    master_addr_suffix: str = fact('"i" on JUWELS (InfiniBand host names), else ""', default="",
                                   check=pattern(HOST_SUFFIX, "host-name characters (letters, digits, '.' and "
                                                 "'-'), e.g. 'i'"))
    gpu_cpu_map: dict[int, tuple[int, ...]] | None = fact(
        "GPU index -> its nearest cores (LUMI GCD->CCD)", default=None,
        check=mapping(key=number(0, MAX_GPUS_PER_NODE, none_ok=False),
                      value=each(number(0, MAX_CORES_PER_NODE, none_ok=False))))
    intra_node_gbps: float | None = fact("Gbit/s between two GPUs of a node (peak, per GPU)", default=None,
                                         check=_GB)
    inter_node_gbps: float | None = fact("Gbit/s between nodes (peak, per node, all NICs)", default=None, check=_GB)
    sources: tuple[str, ...] = fact("where the values came from (seed file or centre doc URL)", default=(),
                                    check=_LINES)
    # additions beyond the shared contract
    scheduler: str = fact('"slurm" | "none" (the local machine)', default="slurm", check=one_of(("slurm", "none")))
    slurm_version: str | None = fact(
        'the Slurm release the cluster runs ("23.11" or "23.11.4"), from the centre\'s page or `sinfo --version` '
        "(clusters check); None: unknown, and lint's version-dependent rules stay quiet", default=None,
        check=rule(lambda v: v is None or parse_version(v) is not None, "{value!r} is not a Slurm version such as "
                   "'23.11' or '23.11.4'"))
    python: str = fact("the interpreter the set-up lines provide", default="python3",
                       check=pattern(COMMAND_WORD, "one command word such as python3 or /appl/bin/python",
                                     empty_ok=False))
    mem_request: str = fact('"proportional" | "whole_node" (--mem=0) | "none" (no --mem)', default="proportional",
                            check=one_of(MEM_REQUESTS))
    mem_per_gpu_gb: float | None = fact("the per-GPU memory share to request; None: mem_per_node/gpus",
                                        default=None, check=_GB)
    gpu_request_accepts: tuple[str, ...] = fact(
        "every GPU syntax the cluster takes (for lint); a file without it: gpu_request's", default=(),
        absent=lambda read: (read["gpu_request"],), check=one_of(GPU_REQUESTS))
    exec_wrapper: str | None = fact("prefix for launchers the module does not wrap (deepspeed)", default=None,
                                    check=pattern(COMMAND, _COMMAND.format("apptainer_wrapper exec")))
    scratch_gres: str | None = fact('the GRES that buys node-local disk ("nvme" on Puhti/Mahti)', default=None,
                                    check=pattern(WORD, "a GRES name such as nvme"))
    scratch_max_gb: float | None = fact("node-local disk a job may fill, as the centre states it (Roihu: 150 GiB "
                                        "per user)", default=None, check=_GB)
    scratch_in_memory: bool = fact('node-local "scratch" is a RAM disk (LUMI-G /tmp): no NVMe offload',
                                   default=False)
    default_time: str = fact("the time limit a job gets when it names none", default="01:00:00",
                             check=slurm_time())
    notes: tuple[str, ...] = fact("what a user of the cluster should know", default=(), check=_LINES)
    path: str = fact("the file the profile was read from", default="", toml=False)
    # the centre's per-GPU share of a shared node, and what happens beyond it (clusters/resources.py)
    max_cores_per_gpu: int | None = fact("cores per GPU within the share", default=None,
                                         check=number(1, MAX_CORES_PER_NODE))
    max_mem_per_gpu_gb: float | None = fact("memory per GPU within the share, GB", default=None, check=_GB)
    gpu_share_policy: str = fact('"enforced": refused beyond the share; "billed": charged for it',
                                 default="billed", check=one_of(("enforced", "billed")))
    billing: str = fact('"gpus": GPU x hours; "max_share": max(GPUs, cores/share, mem/share)', default="gpus",
                        check=one_of(("gpus", "max_share")))
    billing_unit: str = fact("what the centre bills a GPU job in, in its page's words: " + " | ".join(BILLING_UNITS),
                             default="GPU-hours", check=one_of(BILLING_UNITS))
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
                         default="module", check=one_of(("module", "container")))
    default_image: str | None = fact("the image a job gets when it names none", default=None,
                                     check=pattern(IMAGE, "an image path or URI of plain characters, e.g. "
                                                   "/appl/local/containers/pytorch.sif"))
    cpu_arch: str = fact('"x86_64" | "aarch64" (GH200 (Grace) nodes: one CPU per GPU)', default="x86_64",
                         check=one_of(("x86_64", "aarch64")))
    module_multinode_warning: str = fact("said when a multi-node job uses the modules (LUMI: CSC's module)",
                                         default="")
    tensorflow_setup_lines: tuple[str, ...] = fact("the centre's TensorFlow set-up (CSC: module load tensorflow)",
                                                   default=())
    missing_launchers: dict[str, str] = fact("launcher -> why the centre's software lacks it", factory=dict)
    cpu_mem_per_core_gb: float | None = fact("CPU-only jobs: the CPU nodes' memory per core", default=None)
    gpus_per_billing_unit: int = fact("GPUs in one billed GPU-hour (LUMI: 2 GCDs = one MI250X)", default=1,
                                      check=rule(lambda n: n >= 1, "must be at least 1"))
    gpus_per_node_allowed: tuple[int, ...] = fact(
        "the only per-node GPU counts taken (Trillium: 1, 4)", default=(),
        check=rule(lambda counts: all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in counts),
                   "must list positive GPU counts, e.g. [1, 4]"))
    no_allocation_accounts: tuple[str, ...] = fact(
        'account prefixes without an allocation (Alliance: "def-")', default=(),
        check=each(pattern(WORD, "an account prefix such as def-", empty_ok=False)))
    cpu_jobs: str = fact("where CPU-only jobs go when this profile's nodes take none", default="", check=_TEXT)
    wheels: dict[str, str] = fact(
        "framework -> its pip name in the centre's wheelhouse (the Alliance: tensorflow, horovod), installed with "
        "--no-index into the job's venv (python_env_lines) or by 'env create --with'", factory=dict,
        check=mapping(key=pattern(WORD, "a framework name such as tensorflow", empty_ok=False),
                      value=pattern(WORD, "a pip package name such as tensorflow", empty_ok=False)))
    # provenance: the date the centre's documentation was read, each fact's source, and the
    # facts that could not be confirmed ("FIELD: why"; FIELD as in the file, partitions.NAME.KEY)
    checked: str = fact("the date the centre's documentation was read, YYYY-MM-DD", default="", check=date())
    facts: dict[str, str] = fact("FIELD -> the source of its value", factory=dict)
    unconfirmed: tuple[str, ...] = fact(
        '"FIELD: why" for each fact no document confirmed', default=(),
        check=each(rule(lambda e: ":" in e, "entry {value!r} must read 'FIELD: why it is unconfirmed'")))
    # a system that no longer takes jobs: kept so lint can read old scripts
    retired: str | None = fact("the date it stopped taking jobs, YYYY-MM-DD", default=None, check=date())
    successor: str | None = fact("the profile to port scripts to", default=None,
                                 check=pattern(WORD, "a profile name such as roihu"))

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
    known = {f.name for f in fields(ClusterProfile) if f.metadata["toml"]}
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
