"""``make_plan``: a JobRequest and a ClusterProfile in, a Plan out. Pure: no I/O, no clock.

The Plan holds everything the script needs, already decided: the ``#SBATCH`` options, the
set-up lines, the exported environment, the program's shell words, the launcher's facts. The
renderer (``scaletrain.plan.render``) reads only the Plan. The layout rules live in
``scaletrain.plan.layout``; the limits in one check shared with ``lint``
(``scaletrain.clusters.resources``); the launchers in one table (``scaletrain.plan.launchers``).
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.clusters.profile import ClusterProfile, format_time, parse_time
from scaletrain.clusters.resources import ERROR, Resources, billed_gpu_hours
from scaletrain.contract.environ import EXIT_STOPPED, TIME_LIMIT_SIGNAL
from scaletrain.errors import PlanError, UsageError
from scaletrain.plan import layout, software
from scaletrain.plan.jobfiles import JobFile, framework_files
from scaletrain.plan.launchers import SPECS
from scaletrain.plan.layout import StagePlan
from scaletrain.plan.request import JobRequest
from scaletrain.plan.sbatch import sbatch_options
from scaletrain.plan.values import MAX_COUNT
from scaletrain.slurm.parse import srun_cpus_export

# Seconds of warning before the time limit when --requeue is asked (a checkpoint must fit).
REQUEUE_WARNING_S = 300
# How many times a job requeues itself before it gives up (a crash loop must end).
MAX_REQUEUES = 5

__all__ = ["Plan", "StagePlan", "make_plan", "job_name_for", "MAX_REQUEUES", "REQUEUE_WARNING_S"]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A job laid out on a cluster: what the script asks Slurm for and how it launches."""

    request: JobRequest             # for summaries and --json; the renderer does not read it
    profile: ClusterProfile         # likewise
    cluster: str
    partition: str | None           # None: no --partition line (the scheduler routes it)
    partition_family: str           # e.g. "gpu", "lumi-g", for comparisons across revisions
    nodes: int
    gpus_per_node: int
    gpus: int                       # total GPUs (CPU worker slots on the local profile)
    launcher: str
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
    account: str | None
    device: str                     # "auto" | "cpu"
    whole_nodes: bool               # every node's GPUs are used
    exclusive_nodes: bool           # the partition allocates whole nodes
    requeue: bool
    signal_seconds: int | None
    max_requeues: int
    stage: StagePlan | None
    cpu_bind: str | None            # srun --cpu-bind value (LUMI: mask_cpu per GCD)
    sbatch: tuple[tuple[str, str], ...]   # ordered #SBATCH options (name without --, value)
    env: tuple[tuple[str, str], ...]      # exported before launch (ours, the profile's, --env)
    notes: tuple[str, ...]
    scheduler: str                  # "slurm" | "none"
    # what the renderer needs besides the layout, decided here
    job_name: str
    command: tuple[str, ...]        # the argv that produced the plan (provenance header)
    setup: tuple[str, ...]          # software set-up lines
    python: str                     # the interpreter the set-up provides
    container: str                  # "apptainer exec ... IMAGE " or ""
    exec_wrapper: str | None        # prefix for launchers the module does not wrap (deepspeed)
    program_words: str              # the script and its arguments as shell words
    check_scaletrain: bool          # the job imports scaletrain: check for it before launching
    master_addr_suffix: str         # "i" on JUWELS (InfiniBand host names)
    accelerate_config: str | None   # accelerate's --config_file value, a shell word
    job_files: tuple[JobFile, ...] = ()   # framework configs the job writes before launching
    files_dir: str | None = None    # their folder (None: .scaletrain/job-ID in the working directory)
    disk_gb: int | None = None      # node-local disk requested (staged data + NVMe offload)
    image: str | None = None        # the container image (also in ``container``), checked in the job
    software: str = ""              # which Python environment the job uses, in words
    warnings: tuple[str, ...] = ()  # what the job would lack (said now, not after the queue)
    sample_gpus: float | None = None  # --sample-gpus S: a GPU sampler per node every S seconds
    srun_cpus_export: bool = True   # export SRUN_CPUS_PER_TASK (False: the profile's Slurm passes it on)
    requests_gpus: bool = True      # False on a CPU-only cluster: the script asks Slurm for no GPU


def job_name_for(request: JobRequest) -> str:
    """The request's job name, else the training script's file stem made Slurm-safe."""
    if request.job_name:
        return request.job_name
    stem = request.script.rsplit("/", 1)[-1]
    for ext in (".py", ".sh"):
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem) or "scaletrain"


def _family(profile: ClusterProfile, name: str | None) -> str:
    """A name shared by a cluster's GPU partitions across guide revisions (LUMI eap/small-g/standard-g)."""
    if name is None:
        return "default"
    if profile.name == "lumi" and name in ("eap", "small-g", "standard-g", "dev-g"):
        return "lumi-g"
    return name


def check_live(profile: ClusterProfile) -> None:
    """PlanError (exit 2) naming the successor when the profile's system no longer runs jobs."""
    if profile.retired:
        succ = profile.successor or "a live system"
        raise PlanError(f"{profile.name} was retired on {profile.retired} and runs no jobs; its successor is {succ}",
                        f"plan with --cluster {succ}; carry an old script over with "
                        f"'scaletrain port OLD.sh --cluster {succ}'")


def _check_request(req: JobRequest, profile: ClusterProfile) -> None:
    """What the request asks of this cluster, and how its flags combine (each value was checked
    when the request was made)."""
    check_live(profile)
    if req.cpus is not None and profile.cpu_jobs:
        raise PlanError(f"the {profile.name} profile's nodes take no CPU-only jobs (--cpus)", profile.cpu_jobs)
    if req.cpus is not None:
        if req.gpus is not None or req.gpus_per_node is not None:
            raise UsageError("--cpus is for a CPU-only job: leave out --gpus/--gpus-per-node",
                             "a GPU job gets its CPUs from --cpus-per-gpu")
    elif (req.gpus is None) == (req.nodes is None):
        raise UsageError("give --gpus N or --nodes M, not both" if req.gpus is not None else
                         "say how many GPUs: --gpus N or --nodes M (or --cpus N for a CPU-only job)",
                         "e.g. --gpus 8, or --nodes 2 --gpus-per-node 4")
    if req.gpus_per_node is not None and req.nodes is None:
        raise UsageError("--gpus-per-node goes with --nodes", "use --nodes M --gpus-per-node G, or --gpus N")
    if profile.account_required and not req.account:
        raise PlanError(f"cluster {profile.name!r} requires --account (the project billed for the job)",
                        "add --account <project>, or export SBATCH_ACCOUNT=<project>")
    if req.procs_per_gpu > 1 and (profile.gpu_vendor != "nvidia" or (req.nodes or 1) > 1
                                  or (req.gpus or 0) > profile.gpus_per_node):
        raise UsageError("--procs-per-gpu needs NVIDIA MPS on one node (the batch script starts its daemon)",
                         "use one node of an NVIDIA cluster, or one process per GPU")
    if req.launcher == "tensorflow" and profile.scheduler != "slurm":
        raise UsageError(f"--launcher tensorflow builds TF_CONFIG from a Slurm allocation; the {profile.name} "
                         "profile has none",
                         "plan for a cluster, or try the program here with 'scaletrain run --emulate slurm' "
                         "and TF_CONFIG from 'python -m scaletrain.frameworks.tensorflow'")
    if req.requeue and req.launcher in SPECS and not SPECS[req.launcher].requeue_ok:
        raise UsageError(f"--requeue cannot work with --launcher {req.launcher}: its per-node agent dies of the "
                         f"{TIME_LIMIT_SIGNAL} that asks the workers to save, and exits 1 (not {EXIT_STOPPED}) "
                         "when they stop",
                         "use --launcher scaletrain-run (torchrun-style scripts run unchanged and the signal "
                         "reaches them), or a launcher with one task per GPU (scaletrain, srun)")
    _check_horovod(req, profile)
    missing = profile.missing_launchers.get(req.launcher)
    if missing and not (req.container or req.venv or req.conda or req.modules):
        raise PlanError(f"--launcher {req.launcher} on {profile.name}: {missing}",
                        "bring an environment that has it (--container IMAGE, --venv DIR or --module NAME), "
                        "or use a PyTorch launcher")


def _check_horovod(req: JobRequest, profile: ClusterProfile) -> None:
    """A program that imports horovod: one task per GPU, and an environment that has Horovod."""
    if "horovod" not in (req.program_imports or ()):
        return
    if SPECS[req.launcher].per_node:
        raise UsageError(f"{req.script} imports horovod, which takes its ranks from MPI (one task per GPU); "
                         f"--launcher {req.launcher} starts one task per node",
                         "use --launcher mpi (srun starts one task per GPU, as the Alliance's Horovod job does)")
    missing = profile.missing_launchers.get("horovod")
    if missing and not (req.container or req.venv or req.conda):
        raise PlanError(f"{req.script} imports horovod, and {profile.name}'s software has none: {missing}",
                        "bring an environment with Horovod built against the cluster's PyTorch (--venv DIR "
                        "or --container IMAGE), or train with PyTorch DDP (no horovod import)")


def _limits(res: Resources, profile: ClusterProfile) -> list[str]:
    """Refuse the first error of the shared resource check; the warnings become notes."""
    found = res.check(profile)
    errors = [v for v in found if v.severity == ERROR]
    if errors:
        raise PlanError(errors[0].message, errors[0].hint)
    return [f"{v.message} ({v.hint})" for v in found]


def make_plan(request: JobRequest, profile: ClusterProfile) -> Plan:
    """Lay out ``request`` on ``profile``: nodes, partition, tasks, CPUs, memory, #SBATCH lines.

    Raises UsageError for contradictory flags, ProfileError for an unknown partition, and
    PlanError (exit 2, with a hint) for a job the cluster cannot run as asked.
    """
    _check_request(request, profile)
    seconds = parse_time(request.time or profile.default_time)
    if seconds <= 0:
        raise UsageError(f"--time {request.time!r} must be longer than zero", "e.g. --time 01:00:00")
    named = profile.partition(request.partition) if request.partition else None
    nodes, gpn, notes = layout.nodes_and_gpus(request, profile, named, seconds)
    if nodes * gpn > MAX_COUNT:
        raise PlanError(f"{nodes} nodes x {gpn} GPUs is more than {MAX_COUNT:,} GPUs", "ask for a real job's size")
    part = named or layout.choose_partition(profile, nodes=nodes, gpn=gpn, seconds=seconds)
    spec = SPECS[request.launcher]
    per_node = spec.per_node or profile.scheduler == "none"
    tasks, gpt, procs = layout.tasks(request, profile, per_node=per_node, gpn=gpn)
    if spec.one_process:   # the task is the node's only process; it drives every GPU itself
        procs = tasks
    cpus = layout.cpus_per_task(request, profile, tasks_per_node=tasks, gpn=gpn, whole_node=part.whole_node)
    mem, mem_gb = layout.memory(request, profile, gpn=gpn, cpus=cpus * tasks)
    part_name = None if part.implicit else part.name
    res = Resources(nodes=nodes, gpus_per_node=gpn if profile.gpus_per_node else 0, tasks_per_node=tasks,
                    cpus_per_task=cpus, mem_gb=mem_gb, seconds=seconds, partition=part.name,
                    account=request.account)
    notes += _limits(res, profile)
    if part.access:
        notes.append(f"partition {part.name}: {part.access}")
    owns = part.whole_node or request.exclusive or cpus * tasks >= profile.cores_per_node
    bind, bind_note = layout.cpu_bind(profile, per_node=per_node, tasks_per_node=tasks,
                                      cpus_per_task=cpus, owns_node=owns)
    stage = layout.stage_plan(request, profile, job_mem_gb=layout.job_memory_gb(profile, mem_gb, gpn))
    signal_s = None
    if request.requeue:
        signal_s = REQUEUE_WARNING_S if seconds >= 6 * REQUEUE_WARNING_S else max(30, seconds // 6)
        notes.append(f"{TIME_LIMIT_SIGNAL} reaches the batch shell {signal_s} s before the limit; it is passed to every "
                     f"task and the job requeues itself (at most {MAX_REQUEUES} times)")
    notes += [n for n in (bind_note, *_launcher_notes(request, profile, nodes, gpn)) if n]
    device = "cpu" if profile.gpu_vendor == "none" or gpn == 0 else request.device
    fw = framework_files(request, profile, nodes=nodes, world=procs * nodes, device=device)
    notes += fw.notes
    # staged data and NVMe offload share the node's one local-disk request
    disk = ((stage.disk_gb or 0) if stage else 0) + (fw.disk_gb or 0) or None
    threads = max(1, cpus * tasks // procs)
    name = job_name_for(request)
    words = " ".join((software.program_words(request), *fw.program_extra))
    return Plan(
        request=request, profile=profile, cluster=profile.name, partition=part_name,
        partition_family=_family(profile, part_name), nodes=nodes, gpus_per_node=gpn, gpus=nodes * gpn,
        launcher=request.launcher, tasks_per_node=tasks, ntasks=tasks * nodes, gpus_per_task=gpt,
        procs_per_node=procs, world_size=procs * nodes, cpus_per_task=cpus, threads_per_proc=threads, mem=mem,
        mem_per_proc_gb=(mem_gb / procs) if mem_gb else None, time=format_time(seconds),
        time_seconds=seconds, gpu_hours=billed_gpu_hours(res, profile), account=request.account,
        device=device, whole_nodes=gpn == layout.slots(profile), exclusive_nodes=part.whole_node,
        requeue=request.requeue, signal_seconds=signal_s, max_requeues=MAX_REQUEUES, stage=stage,
        cpu_bind=bind, notes=tuple(notes), scheduler=profile.scheduler,
        sbatch=sbatch_options(request, profile, job_name=name, partition=part_name, nodes=nodes,
                              tasks_per_node=tasks, cpus_per_task=cpus, mem=mem, seconds=seconds, gpn=gpn,
                              gpus_per_task=gpt, disk_gb=disk, signal_s=signal_s),
        env=fw.env + software.environment(request, profile, threads=threads, device=device),
        job_name=name, command=tuple(request.command), setup=software.setup_lines(request, profile),
        python=software.python_of(request, profile), exec_wrapper=profile.exec_wrapper,
        container=software.container_prefix(request, profile, scratch=stage.scratch_var if stage else None),
        program_words=words,
        check_scaletrain=spec.needs_scaletrain or profile.scheduler == "none",
        image=software.image(request, profile), software=software.describe(request, profile),
        sample_gpus=request.sample_gpus,
        srun_cpus_export=srun_cpus_export(profile.slurm_version),
        requests_gpus=profile.gpus_per_node > 0,
        warnings=tuple(software.warnings(request, profile, needs_scaletrain=spec.needs_scaletrain)),
        master_addr_suffix=profile.master_addr_suffix, accelerate_config=fw.accelerate_word,
        job_files=fw.files, disk_gb=disk,
        files_dir=request.files_dir or None,
    )


def _launcher_notes(request: JobRequest, profile: ClusterProfile, nodes: int, gpn: int) -> list[str]:
    notes = []
    if request.launcher == "lightning":
        notes.append(f"Lightning: Trainer(devices={gpn}, num_nodes={nodes}, strategy='ddp') must match "
                     "this allocation (CSC guide 'Multi-GPU and multi-node machine learning')")
    if request.launcher == "deepspeed" and nodes > 1:
        notes.append("deepspeed launcher: one task per node, nodes joined with --no_ssh and "
                     "--node_rank=$SLURM_NODEID (needs DeepSpeed >= 0.14)")
    if software.image(request, profile) and profile.container is None:
        notes.append("the program runs inside the container given by --container (apptainer exec)")
    horovod = profile.missing_launchers.get("horovod")
    own_env = request.venv or request.conda or request.container
    if horovod and request.launcher == "mpi" and request.program_imports is None:
        notes.append(f"if the program uses Horovod: {horovod}; bring it with --venv or --container")
    elif horovod and "horovod" in (request.program_imports or ()):
        notes.append("Horovod from your own environment: its last release (0.28.1) builds against torch >= 2.1 "
                     "only with its PyTorch extension raised to C++17 (docs/bring-your-script.md, 'Building Horovod')")
    elif "horovod" in profile.wheels and request.launcher == "mpi" and not own_env and \
            "horovod" in (request.program_imports or ("horovod",)):
        notes.append(f"if the program uses Horovod: the job's venv gets only torch; make one with the centre's "
                     f"Horovod wheel ('scaletrain env create --cluster {profile.name} --with horovod DIR') and "
                     "pass --venv DIR")
    if layout.venv_in_scratch(request, profile):
        notes.append(f"the job builds its venv in {profile.scratch_var}, which is memory on {profile.name} "
                     "(no local disk): it takes a few GB of the job's memory; a venv on $SCRATCH (--venv) does not")
    if nodes > 1 and profile.module_multinode_warning and not request.container and (
            profile.software == "module" or request.modules):
        notes.append(profile.module_multinode_warning)
    if request.expand_args:
        notes.append("--expand-args: $NAME in the program's arguments expands when the job runs, in the batch "
                     "shell (job-wide values)")
    return notes
