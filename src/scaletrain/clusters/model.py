"""What a cluster offers and how a job asks for it: the profile's data types, no loading.

:mod:`scaletrain.clusters.profile` finds and reads the TOML files and
:mod:`scaletrain.clusters.schema` turns their tables into these objects; both import this
module, neither imports the other at load time. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scaletrain.errors import ProfileError
from scaletrain.slurm.parse import format_time, parse_time_seconds  # Slurm's time syntax, one parser

__all__ = ["GPU_REQUESTS", "JOB_PACKAGES", "MEM_REQUESTS", "ClusterProfile", "Partition", "format_time",
           "parse_time"]

GPU_REQUESTS = ("gres_typed", "gres", "gpus_per_node", "gpus_per_node_typed", "gpus_per_task")
MEM_REQUESTS = ("proportional", "whole_node", "none")
# In ``python_env_lines``: the wheels the job's venv installs (torch, or the launcher's framework)
JOB_PACKAGES = "@PACKAGES@"


@dataclass(frozen=True, kw_only=True)
class Partition:
    """One Slurm partition and the limits a plan must respect."""

    name: str
    gpus: bool = True                   # a GPU partition
    max_gpus: int | None = None         # per job (Mahti gpusmall: 2; Roihu gpumedium: 4)
    min_gpus: int | None = None         # per job (Roihu gpularge: 4)
    max_nodes: int | None = None
    min_nodes: int | None = None
    # the node limit for an account without an allocation (Trillium: 5 on a def- account, 25
    # with a RAC allocation); which accounts have none: ClusterProfile.no_allocation_accounts
    max_nodes_no_allocation: int | None = None
    cores_per_node: int | None = None   # the partition's nodes, when not the profile's (LUMI-C small: 128)
    whole_node: bool = False            # only whole nodes are allocated (LUMI standard-g)
    max_time: str | None = None         # "HH:MM:SS" or "D-HH:MM:SS"
    default: bool = False
    # additions beyond the shared contract
    test: bool = False                  # a short test/debug queue: chosen only when named
    implicit: bool = False              # the scheduler routes jobs itself: no --partition line
    description: str = ""
    access: str = ""                    # a condition for using it, said in the plan (Roihu gpularge)

    @property
    def max_seconds(self) -> int | None:
        """``max_time`` in seconds, or None when the partition has no limit."""
        return parse_time(self.max_time) if self.max_time else None


@dataclass(frozen=True, kw_only=True)
class ClusterProfile:
    """Everything scaletrain knows about one cluster (see the module docstring for the source)."""

    name: str
    description: str
    site: str
    gpus_per_node: int
    gpu_model: str
    gpu_memory_gb: float
    gpu_vendor: str                     # "nvidia" | "amd" | "none"
    cores_per_node: int                 # usable by jobs
    mem_per_node_gb: float              # requestable
    partitions: dict[str, Partition]    # in file order
    gpu_request: str                    # "gres_typed" | "gres" | "gpus_per_node" | "gpus_per_task"
    gres_type: str | None               # "v100", "a100", ...
    account_required: bool
    scratch_var: str | None             # "$LOCAL_SCRATCH", "$SLURM_TMPDIR", "$TMPDIR"
    setup_lines: tuple[str, ...]        # module loads etc.
    container: str | None               # wrapper command for containers, or None
    env: dict[str, str]                 # e.g. {"NCCL_SOCKET_IFNAME": "hsn"} on LUMI
    master_addr_suffix: str             # "i" on JUWELS (InfiniBand host names), else ""
    gpu_cpu_map: dict[int, tuple[int, ...]] | None   # GPU index -> nearest cores (LUMI GCD->CCD)
    intra_node_gbps: float | None       # Gbit/s between two GPUs of a node (peak, per GPU)
    inter_node_gbps: float | None       # Gbit/s between nodes (peak, per node, all NICs)
    sources: tuple[str, ...]            # where values came from (seed file or centre doc URL)
    # additions beyond the shared contract (all defaulted)
    scheduler: str = "slurm"            # "slurm" | "none" (the local machine)
    python: str = "python3"             # interpreter the set-up lines provide
    mem_request: str = "proportional"   # "proportional" | "whole_node" (--mem=0) | "none" (no --mem)
    mem_per_gpu_gb: float | None = None  # the per-GPU share to request; None: mem_per_node/gpus
    gpu_request_accepts: tuple[str, ...] = ()  # every GPU syntax the cluster takes (for lint)
    exec_wrapper: str | None = None     # prefix for launchers the module does not wrap (deepspeed)
    scratch_gres: str | None = None     # GRES that buys node-local disk ("nvme" on Puhti/Mahti)
    scratch_max_gb: float | None = None  # node-local disk a job may fill, as the centre states it (Roihu: 150 GiB per user)
    scratch_in_memory: bool = False     # node-local "scratch" is a RAM disk (LUMI-G /tmp): no NVMe offload
    default_time: str = "01:00:00"
    notes: tuple[str, ...] = ()
    path: str = ""                      # the file the profile was read from
    # the centre's per-GPU share of a shared node, and what happens beyond it (clusters/resources.py)
    max_cores_per_gpu: int | None = None
    max_mem_per_gpu_gb: float | None = None
    gpu_share_policy: str = "billed"    # "enforced": refused beyond the share; "billed": charged for it
    billing: str = "gpus"               # "gpus": GPU x hours; "max_share": max(GPUs, cores/share, mem/share)
    # containers: what `apptainer exec` needs on this cluster (bind mounts, set-up before it)
    container_binds: tuple[str, ...] = ()
    container_setup_lines: tuple[str, ...] = ()
    # the Python environment a job gets when it names none (--venv/--conda): e.g. a virtualenv
    # built on each node from the centre's wheels (Alliance)
    python_env_lines: tuple[str, ...] = ()
    # the job's software by default: the centre's modules, or a container image (default_image)
    # run with the ``container`` wrapper (LUMI AI Factory images with "singularity exec")
    software: str = "module"            # "module" | "container"
    default_image: str | None = None
    cpu_arch: str = "x86_64"            # "aarch64" on GH200 (Grace) nodes: one CPU per GPU
    module_multinode_warning: str = ""  # said when a multi-node job uses the modules (LUMI: CSC's module)
    tensorflow_setup_lines: tuple[str, ...] = ()   # the centre's TensorFlow set-up (CSC: module load tensorflow)
    missing_launchers: dict[str, str] = field(default_factory=dict)  # launcher -> why the centre's software lacks it
    cpu_mem_per_core_gb: float | None = None       # CPU-only jobs: the CPU nodes' memory per core
    gpus_per_billing_unit: int = 1      # GPUs in one billed GPU-hour (LUMI: 2 GCDs = one MI250X)
    gpus_per_node_allowed: tuple[int, ...] = ()   # the only per-node GPU counts taken (Trillium: 1, 4)
    no_allocation_accounts: tuple[str, ...] = ()  # account prefixes without an allocation (Alliance: "def-")
    cpu_jobs: str = ""                  # where CPU-only jobs go when this profile's nodes take none
    # framework -> its pip name in the centre's wheelhouse (the Alliance: tensorflow, horovod),
    # installed with --no-index into the job's venv (python_env_lines) or by 'env create --with'
    wheels: dict[str, str] = field(default_factory=dict)
    # provenance: the date the centre's documentation was read, each fact's source, and the
    # facts that could not be confirmed ("FIELD: why"; FIELD as in the file, partitions.NAME.KEY)
    checked: str = ""
    facts: dict[str, str] = field(default_factory=dict)
    unconfirmed: tuple[str, ...] = ()
    # a system that no longer takes jobs: kept so lint can read old scripts
    retired: str | None = None          # the date it stopped taking jobs
    successor: str | None = None        # the profile to port scripts to

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
