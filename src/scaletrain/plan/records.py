"""The records a request passes through on its way to a batch script, one per stage, all frozen.

A ``Plan`` is the tuple of what each stage decided, in the order the stages run::

    settle     (request, profile)             -> Settled     scaletrain.plan.settle
    resources  (Settled)                      -> Allocation  scaletrain.plan.resources
    software   (Settled, Allocation)          -> Software    scaletrain.plan.software
    files      (Settled, Allocation)          -> Files       scaletrain.plan.jobfiles
    render     (Plan)                         -> text        scaletrain.plan.render

Each fact of a job is a field of the one record whose stage decides it; a later stage, the
renderer and the readers (``summary``, ``envs.check``, ``port``) read it there. This module
holds data only: no rule, no I/O, nothing that imports a stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.clusters.model import ClusterProfile
from scaletrain.plan.request import JobRequest


@dataclass(frozen=True)
class RunningEnv:
    """The environment running scaletrain on a login node: ``kind`` is "venv", "conda" or
    "python" (the request field it fills), ``path`` its folder or interpreter."""

    kind: str
    path: str

    @property
    def origin(self) -> str:
        """How it was found, for the plan's summary."""
        what = {"venv": "the venv", "conda": "the conda environment", "python": "the Python"}[self.kind]
        return f"{what} running scaletrain on this login node"


@dataclass(frozen=True, kw_only=True)
class Settled:
    """Stage 1: the request as the cluster and this machine settle it."""

    request: JobRequest      # as planned: the account, the staged data's size, the program's imports, the
    #                          environment found on a login node, the run folder (submit)
    profile: ClusterProfile
    image: str | None        # the container image the program runs in (--container, else the profile's)


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    """Copy or extract a dataset to node-local scratch, once per node, before training."""

    source: str           # path as given (on the shared file system)
    kind: str             # "dir" | "tar" | "tar.gz" | "tar.bz2" | "tar.xz" | "zip" | "file"
    scratch_var: str      # "$LOCAL_SCRATCH", "$SLURM_TMPDIR", ...
    dest_name: str        # folder under scratch_var
    disk_gb: int | None   # node-local disk to request (Puhti/Mahti --gres=nvme:GB), else None


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """Stage 2, resources: what the job asks of the cluster and how its processes sit on it."""

    partition: str | None           # None: no --partition line (the scheduler routes it)
    partition_family: str           # e.g. "gpu", "lumi-g", for comparisons across revisions
    nodes: int
    gpus_per_node: int
    gpus: int                       # total GPUs (CPU worker slots on the local profile)
    tasks_per_node: int             # Slurm tasks per node
    ntasks: int
    gpus_per_task: int              # 0: tasks share GPUs (MPS)
    procs_per_node: int             # training processes per node (GPUs x --procs-per-gpu / --gpus-per-proc)
    world_size: int
    cpus_per_task: int
    threads_per_proc: int           # OMP_NUM_THREADS for each training process
    mem: str | None                 # the --mem value ("320G", "0") or None for no line
    mem_per_proc_gb: float | None
    time: str                       # HH:MM:SS / D-HH:MM:SS
    time_seconds: int
    gpu_hours: float                # billed GPU-hours (the profile's billing rule)
    device: str                     # "auto" | "cpu"
    whole_nodes: bool               # every node's GPUs are used
    exclusive_nodes: bool           # the partition allocates whole nodes
    signal_seconds: int | None      # --requeue: the warning before the time limit
    max_requeues: int
    stage: StagePlan | None
    disk_gb: int | None             # node-local disk requested (staged data + NVMe offload)
    venv_in_scratch: bool           # the job builds its venv in node-local scratch that is memory
    cpu_bind: str | None            # srun --cpu-bind value (LUMI: mask_cpu per GCD)
    srun_cpus_export: bool          # export SRUN_CPUS_PER_TASK (False: the profile's Slurm passes it on)
    requests_gpus: bool             # False on a CPU-only cluster: the script asks Slurm for no GPU
    notes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Software:
    """Stage 3: the job's Python, and the lines and words that give it to the job."""

    setup: tuple[str, ...]          # the lines that make the job's Python (profile, --module, --venv/--conda, wheels)
    mps: tuple[str, ...]            # the NVIDIA MPS daemon's lines (--procs-per-gpu); --setup lines follow them
    python: str                     # the interpreter the set-up provides
    container: str                  # "apptainer exec ... IMAGE " or ""
    container_here: str             # the same without node-local binds (what a login node can run)
    exec_wrapper: str | None        # prefix for launchers the module does not wrap (deepspeed)
    builds_venv: bool               # the job's Python is a venv it builds from the centre's wheels
    wheels: str                     # what such a venv installs (torch, or the launcher's framework; --wheels)
    env: tuple[tuple[str, str], ...]   # exported before launch (ours, the profile's, --env)
    check_scaletrain: bool          # the job imports scaletrain: check for it before launching
    description: str                # which Python environment the job uses, in words
    warnings: tuple[str, ...]       # what the job would lack (said now, not after the queue)
    notes: tuple[str, ...]


@dataclass(frozen=True)
class JobFile:
    """A config file the job writes before it launches."""

    var: str             # the exported variable that holds its path
    name: str            # the file's name in the job's folder
    text: str            # its content (``SCRATCH_PLACEHOLDER`` stands for the node-local disk)
    what: str            # the script's comment
    scratch: str | None = None   # the node-local disk (``$LOCAL_SCRATCH`` or a path) the text uses


@dataclass(frozen=True, kw_only=True)
class Files:
    """Stage 4: what the job writes and reads besides the program: its framework configs."""

    job_files: tuple[JobFile, ...] = ()   # the configs the job writes before launching
    accelerate_config: str | None = None  # accelerate's --config_file value, a shell word
    program_extra: tuple[str, ...] = ()   # shell words after the program's own arguments
    env: tuple[tuple[str, str], ...] = ()  # literal exports (the user's own config file)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A job laid out on a cluster: the records of its stages, in order."""

    settled: Settled
    resources: Allocation
    software: Software
    files: Files


__all__ = ["Allocation", "Files", "JobFile", "Plan", "RunningEnv", "Settled", "Software", "StagePlan"]
