"""``make_plan``: a JobRequest and a ClusterProfile in, a Plan out. Pure: no I/O, no clock.

The rules (issue 3, seeds 000/001/003/004):

- GPUs that fit one node run on one node; more run on whole nodes. A GPU count that is not a
  multiple of the node's GPUs is refused unless the partition shares nodes (then the GPUs are
  spread evenly, with a note: seed 000 says split nodes are for testing only).
- The partition follows the profile: the named one, else the first non-test GPU partition whose
  limits fit, preferring whole-node partitions for whole nodes (Mahti gpumedium, LUMI
  standard-g) and shared ones for part of a node (Mahti gpusmall, LUMI small-g).
- Tasks per node follow the launcher: one per GPU (scaletrain, srun, mpi, lightning) or one per
  node (torchrun, accelerate, deepspeed).
- CPUs per task = the node's usable cores per GPU x GPUs per task (Puhti 10, Mahti 32, LUMI 7);
  on a whole-node allocation every core of the node is handed out.
- Memory per the profile: proportional to GPUs, the whole node (--mem=0), or left to Slurm.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.clusters.profile import ClusterProfile, Partition, format_time, parse_time
from scaletrain.errors import PlanError, ProfileError, UsageError
from scaletrain.plan.request import DEVICES, LAUNCHERS, JobRequest, format_mem

# Seconds of warning before the time limit when --requeue is asked (a checkpoint must fit).
REQUEUE_WARNING_S = 300
# How many times a job requeues itself before it gives up (a crash loop must end).
MAX_REQUEUES = 5


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    """Copy or extract a dataset to node-local scratch, once per node, before training."""

    source: str           # path as given (on the shared file system)
    kind: str             # "dir" | "tar" | "tar.gz" | "tar.bz2" | "tar.xz" | "zip" | "file"
    scratch_var: str      # "$LOCAL_SCRATCH", "$SLURM_TMPDIR", ...
    dest_name: str        # folder under scratch_var
    disk_gb: int | None   # node-local disk to request (Puhti/Mahti --gres=nvme:GB), else None


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A job laid out on a cluster: what the script asks Slurm for and how it launches."""

    request: JobRequest
    profile: ClusterProfile
    cluster: str
    partition: str | None           # None: no --partition line (the scheduler routes it)
    partition_family: str           # e.g. "gpu", "lumi-g", for comparisons across revisions
    nodes: int
    gpus_per_node: int
    gpus: int                       # total GPUs (CPU worker slots on the local profile)
    launcher: str
    tasks_per_node: int             # Slurm tasks per node
    ntasks: int
    gpus_per_task: int
    procs_per_node: int             # training processes per node (= GPUs per node)
    world_size: int
    cpus_per_task: int
    threads_per_proc: int           # OMP_NUM_THREADS for each training process
    mem: str | None                 # the --mem value ("320G", "0") or None for no line
    mem_per_proc_gb: float | None
    time: str                       # HH:MM:SS / D-HH:MM:SS
    time_seconds: int
    gpu_hours: float
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
    env: tuple[tuple[str, str], ...]      # exported before launch (profile env + ours)
    notes: tuple[str, ...]
    scheduler: str                  # "slurm" | "none"

    @property
    def job_name(self) -> str:
        """The --job-name: the request's, else the script's file stem."""
        return job_name_for(self.request)


def job_name_for(request: JobRequest) -> str:
    """The request's job name, else the training script's file stem made Slurm-safe."""
    if request.job_name:
        return request.job_name
    stem = request.script.rsplit("/", 1)[-1]
    for ext in (".py", ".sh"):
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem) or "scaletrain"


# --------------------------------------------------------------------------- helpers

def _family(profile: ClusterProfile, part: Partition | None) -> str:
    """A name shared by a cluster's GPU partitions across guide revisions (LUMI eap/small-g/standard-g)."""
    if part is None or part.implicit:
        return "default"
    name = part.name
    if profile.name == "lumi" and name in ("eap", "small-g", "standard-g", "dev-g"):
        return "lumi-g"
    return name


def _check_request(req: JobRequest, profile: ClusterProfile) -> None:
    if req.launcher not in LAUNCHERS:
        raise UsageError(f"unknown launcher {req.launcher!r}", "use one of: " + ", ".join(LAUNCHERS))
    if req.device not in DEVICES:
        raise UsageError(f"unknown device {req.device!r}", "use --device auto or --device cpu")
    if (req.gpus is None) == (req.nodes is None):
        both = req.gpus is not None
        raise UsageError("give --gpus N or --nodes M, not both" if both else
                         "say how many GPUs: --gpus N or --nodes M",
                         "e.g. --gpus 8, or --nodes 2 --gpus-per-node 4")
    if req.gpus_per_node is not None and req.nodes is None:
        raise UsageError("--gpus-per-node goes with --nodes", "use --nodes M --gpus-per-node G, or --gpus N")
    for flag, value in (("--gpus", req.gpus), ("--nodes", req.nodes),
                        ("--gpus-per-node", req.gpus_per_node), ("--cpus-per-gpu", req.cpus_per_gpu)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}", f"give {flag} a positive number")
    if not req.script:
        raise UsageError("no training script given", "put it after '--': ... -- train.py --epochs 3")
    if profile.account_required and not req.account:
        raise PlanError(f"cluster {profile.name!r} requires --account (the project billed for the job)",
                        "add --account <project>, or export SBATCH_ACCOUNT=<project>")


def _slots(profile: ClusterProfile) -> int:
    # Without GPUs ("local"), a "GPU" is a CPU worker process: at most one per core.
    return profile.gpus_per_node if profile.gpus_per_node > 0 else profile.cores_per_node


def _split_gpus(gpus: int, per_node: int) -> tuple[int, int]:
    """Fewest nodes that hold ``gpus`` evenly (same count on every node, at most per_node)."""
    nodes = -(-gpus // per_node)
    while gpus % nodes or gpus // nodes > per_node:
        nodes += 1
    return nodes, gpus // nodes


def _nearest_multiples(gpus: int, per_node: int) -> str:
    lo, hi = (gpus // per_node) * per_node, (gpus // per_node + 1) * per_node
    return f"--gpus {lo} or --gpus {hi}" if lo else f"--gpus {hi}"


def _fits(part: Partition, *, nodes: int, gpus: int, seconds: int | None) -> str | None:
    """Why ``part`` cannot take the job, or None when it can."""
    if part.max_gpus is not None and gpus > part.max_gpus:
        return f"at most {part.max_gpus} GPUs"
    if part.max_nodes is not None and nodes > part.max_nodes:
        return f"at most {part.max_nodes} node{'s' if part.max_nodes != 1 else ''}"
    if part.min_nodes is not None and nodes < part.min_nodes:
        return f"at least {part.min_nodes} nodes"
    if seconds is not None and part.max_seconds is not None and seconds > part.max_seconds:
        return f"at most {part.max_time}"
    return None


def _choose_partition(profile: ClusterProfile, *, nodes: int, gpus: int, whole: bool,
                      seconds: int | None) -> Partition:
    candidates = [p for p in profile.partitions.values() if p.gpus and not p.test] \
        if profile.gpus_per_node > 0 else [p for p in profile.partitions.values() if not p.test]
    if not candidates:
        raise ProfileError(f"profile {profile.name!r} has no GPU partition",
                           "add a [partitions.NAME] table to the profile")
    fitting = [p for p in candidates if _fits(p, nodes=nodes, gpus=gpus, seconds=seconds) is None]
    if not fitting:
        why = "; ".join(f"{p.name}: {_fits(p, nodes=nodes, gpus=gpus, seconds=seconds)}" for p in candidates)
        limit_time = seconds is not None and all(
            p.max_seconds is not None and seconds > p.max_seconds for p in candidates)
        if limit_time:
            longest = max(candidates, key=lambda p: p.max_seconds or 0)
            raise PlanError(f"--time {format_time(seconds or 0)} is above every GPU partition's limit on "
                            f"{profile.name} ({why})",
                            f"ask --time {longest.max_time} or less and checkpoint, with --requeue "
                            "to continue in the next job")
        raise PlanError(f"no partition on {profile.name} takes {gpus} GPUs on {nodes} node"
                        f"{'s' if nodes != 1 else ''} ({why})",
                        "ask for fewer GPUs, or name a partition with --partition")
    if whole:
        preferred = [p for p in fitting if p.whole_node] or fitting
    else:
        preferred = [p for p in fitting if not p.whole_node] or fitting
    defaults = [p for p in preferred if p.default]
    return defaults[0] if defaults else preferred[0]


def _check_partition(profile: ClusterProfile, part: Partition, *, nodes: int, gpus: int,
                     gpn: int, seconds: int) -> list[str]:
    """Limits of a partition the user named (or we chose); returns notes."""
    notes: list[str] = []
    per = _slots(profile)
    if profile.gpus_per_node > 0 and not part.gpus:
        raise PlanError(f"partition {part.name!r} on {profile.name} has no GPUs",
                        "pick a GPU partition: " + ", ".join(p.name for p in profile.partitions.values() if p.gpus))
    if part.max_seconds is not None and seconds > part.max_seconds:
        raise PlanError(f"--time {format_time(seconds)} is above the {part.max_time} limit of partition "
                        f"{part.name!r} on {profile.name}",
                        f"ask --time {part.max_time} or less (checkpoint, and --requeue to continue)")
    if part.max_gpus is not None and gpus > part.max_gpus:
        bigger = [p.name for p in profile.partitions.values()
                  if p.gpus and p is not part and (p.max_gpus is None or p.max_gpus >= gpus)]
        raise PlanError(f"partition {part.name!r} on {profile.name} allows at most {part.max_gpus} GPUs, "
                        f"not {gpus}",
                        (f"use --partition {bigger[0]}" if bigger else f"ask for {part.max_gpus} GPUs or fewer")
                        + " (or leave --partition out to let scaletrain choose)")
    if part.max_nodes is not None and nodes > part.max_nodes:
        raise PlanError(f"partition {part.name!r} on {profile.name} allows at most {part.max_nodes} "
                        f"node{'s' if part.max_nodes != 1 else ''}, not {nodes}",
                        "ask for fewer GPUs, or leave --partition out to let scaletrain choose")
    if part.min_nodes is not None and nodes < part.min_nodes:
        raise PlanError(f"partition {part.name!r} on {profile.name} needs at least {part.min_nodes} nodes",
                        "ask for more GPUs, or leave --partition out")
    if part.whole_node and gpn < per:
        shared = [p.name for p in profile.partitions.values()
                  if p.gpus and not p.whole_node and not p.test
                  and _fits(p, nodes=nodes, gpus=gpus, seconds=seconds) is None]
        if shared:
            raise PlanError(f"partition {part.name!r} on {profile.name} allocates whole nodes of {per} GPUs; "
                            f"{gpn} GPU{'s' if gpn != 1 else ''} per node would leave the rest idle",
                            f"use --partition {shared[0]}, or ask for {per} GPUs per node")
        notes.append(f"{part.name} allocates whole nodes: the job is billed for {per} GPUs per node "
                     f"but uses {gpn}")
    return notes


# --------------------------------------------------------------------------- the planner

def make_plan(request: JobRequest, profile: ClusterProfile) -> Plan:
    """Lay out ``request`` on ``profile``: nodes, partition, tasks, CPUs, memory, #SBATCH lines.

    Raises UsageError for contradictory flags, ProfileError for an unknown partition, and
    PlanError (exit 2, with a hint) for a job the cluster cannot run as asked.
    """
    _check_request(request, profile)
    per = _slots(profile)
    notes: list[str] = []
    seconds = parse_time(request.time) if request.time else parse_time(profile.default_time)
    if seconds <= 0:
        raise UsageError(f"--time {request.time!r} must be longer than zero", "e.g. --time 01:00:00")

    # ---- nodes and GPUs per node
    named = profile.partition(request.partition) if request.partition else None
    if request.nodes is not None:
        nodes = request.nodes
        gpn = request.gpus_per_node if request.gpus_per_node is not None else per
        if gpn > per:
            raise PlanError(f"a {profile.name} node has {per} GPUs, not {gpn}",
                            f"use --gpus-per-node {per} or fewer, and more --nodes")
        gpus = nodes * gpn
    else:
        gpus = int(request.gpus or 0)
        if profile.scheduler == "none" and gpus > per:
            raise PlanError(f"this machine has {per} cores; {gpus} worker processes would oversubscribe it",
                            f"use --gpus {per} or fewer with --cluster local")
        if gpus <= per:
            nodes, gpn = 1, gpus
        elif gpus % per == 0:
            nodes, gpn = gpus // per, per
        else:
            # Not whole nodes: only a partition that shares nodes can take it.
            probe_nodes, probe_gpn = _split_gpus(gpus, per)
            part_try = named or _choose_partition(profile, nodes=probe_nodes, gpus=gpus, whole=False,
                                                  seconds=seconds)
            if part_try.whole_node:
                raise PlanError(f"{gpus} GPUs is not a multiple of the {per} GPUs of a {profile.name} node "
                                f"(partition {part_try.name!r} allocates whole nodes)",
                                f"use {_nearest_multiples(gpus, per)}, or --nodes M --gpus-per-node G")
            nodes, gpn = probe_nodes, probe_gpn
            notes.append(f"{gpus} GPUs spread as {nodes} nodes x {gpn}: communication between nodes is "
                         f"slower than inside one; prefer {_nearest_multiples(gpus, per)} (seed 000)")

    whole = gpn == per
    part = named or _choose_partition(profile, nodes=nodes, gpus=gpus, whole=whole, seconds=seconds)
    notes += _check_partition(profile, part, nodes=nodes, gpus=gpus, gpn=gpn, seconds=seconds)
    exclusive = part.whole_node

    # ---- tasks and CPUs
    per_node = request.per_node_launcher or profile.scheduler == "none"
    tasks_per_node = 1 if per_node else gpn
    gpus_per_task = gpn if per_node else 1
    if profile.scheduler == "none":
        cpus_per_task = profile.cores_per_node                      # the whole machine
    elif request.cpus_per_gpu is not None:
        cpus_per_task = request.cpus_per_gpu * gpus_per_task
    elif exclusive or profile.mem_request == "whole_node":
        cpus_per_task = profile.cores_per_node // tasks_per_node   # hand out the whole node
    else:
        cpus_per_task = profile.cores_per_gpu * gpus_per_task
    if cpus_per_task * tasks_per_node > profile.cores_per_node:
        raise PlanError(f"{cpus_per_task * tasks_per_node} CPU cores per node asked; a {profile.name} node "
                        f"has {profile.cores_per_node} usable",
                        f"use --cpus-per-gpu {profile.cores_per_gpu} or fewer")
    cpus_per_task = max(1, cpus_per_task)
    threads = max(1, cpus_per_task // gpus_per_task)

    # ---- memory
    mem_gb: float | None
    mem: str | None
    if request.mem_per_gpu_gb is not None:
        mem_gb = request.mem_per_gpu_gb * gpn
    elif profile.mem_request == "proportional":
        # the per-GPU share times GPUs, never above what a node offers (Graham: 2 x 64000M > node)
        mem_gb = min(profile.mem_per_gpu * gpn, profile.mem_per_node_gb or float("inf"))
    else:
        mem_gb = None
    if mem_gb is not None:
        if profile.mem_per_node_gb and mem_gb > profile.mem_per_node_gb + 1e-9:
            raise PlanError(f"{format_mem(mem_gb)} of memory per node asked; a {profile.name} node offers "
                            f"{format_mem(profile.mem_per_node_gb)}",
                            f"use --mem-per-gpu {format_mem(profile.mem_per_node_gb / max(1, per))} or less")
        mem = format_mem(mem_gb)
    elif profile.mem_request == "whole_node" and profile.scheduler == "slurm":
        mem = "0"   # Slurm: all the memory of each node
    else:
        mem = None
    if mem == "0":
        mem_per_proc = profile.mem_per_node_gb / max(1, gpn) if profile.mem_per_node_gb else None
    else:
        mem_per_proc = mem_gb / max(1, gpn) if mem_gb is not None else None

    # ---- data staging
    stage = _stage_plan(request, profile)

    # ---- requeue
    signal_s: int | None = None
    if request.requeue:
        signal_s = REQUEUE_WARNING_S if seconds >= 6 * REQUEUE_WARNING_S else max(30, seconds // 6)
        notes.append(f"USR1 reaches the batch shell {signal_s} s before the limit; it is passed to every "
                     f"task and the job requeues itself (at most {MAX_REQUEUES} times)")

    device = "cpu" if profile.gpu_vendor == "none" else request.device
    sbatch = _sbatch_lines(request, profile, part, nodes=nodes, tasks_per_node=tasks_per_node,
                           cpus_per_task=cpus_per_task, mem=mem, seconds=seconds, gpn=gpn,
                           gpus_per_task=gpus_per_task, stage=stage, signal_s=signal_s)
    env = _env(request, profile, threads=threads, device=device)
    cpu_bind = _cpu_bind(profile, per_node=per_node, gpn=gpn, whole=whole, tasks_per_node=tasks_per_node)

    if request.launcher == "lightning":
        notes.append(f"Lightning: Trainer(devices={gpn}, num_nodes={nodes}, strategy='ddp') must match "
                     "this allocation (seed 000)")
    if request.launcher == "deepspeed" and nodes > 1:
        notes.append("deepspeed launcher: one task per node, nodes joined with --no_ssh and "
                     "--node_rank=$SLURM_NODEID (needs DeepSpeed >= 0.14)")
    if request.container and profile.container is None:
        notes.append("the program runs inside the container given by --container (apptainer exec)")

    part_name = None if part.implicit else part.name
    return Plan(
        request=request, profile=profile, cluster=profile.name, partition=part_name,
        partition_family=_family(profile, part), nodes=nodes, gpus_per_node=gpn, gpus=gpus,
        launcher=request.launcher, tasks_per_node=tasks_per_node, ntasks=tasks_per_node * nodes,
        gpus_per_task=gpus_per_task, procs_per_node=gpn, world_size=gpn * nodes,
        cpus_per_task=cpus_per_task, threads_per_proc=threads, mem=mem, mem_per_proc_gb=mem_per_proc,
        time=format_time(seconds), time_seconds=seconds,
        gpu_hours=round(gpus * seconds / 3600, 2) if profile.gpus_per_node > 0 else 0.0,
        account=request.account, device=device, whole_nodes=whole, exclusive_nodes=exclusive,
        requeue=request.requeue, signal_seconds=signal_s, max_requeues=MAX_REQUEUES, stage=stage,
        cpu_bind=cpu_bind, sbatch=sbatch, env=env, notes=tuple(notes),
        scheduler=profile.scheduler,
    )


def _stage_plan(request: JobRequest, profile: ClusterProfile) -> StagePlan | None:
    src = request.stage_data
    if not src:
        return None
    if not profile.scratch_var:
        raise PlanError(f"{profile.name} nodes have no node-local scratch to stage data to",
                        "leave out --stage-data and read the data from the shared scratch file system")
    low = src.rstrip("/").lower()
    kinds = ((".tar.gz", "tar.gz"), (".tgz", "tar.gz"), (".tar.bz2", "tar.bz2"), (".tar.xz", "tar.xz"),
             (".tar", "tar"), (".zip", "zip"))
    kind = "dir" if src.endswith("/") else next((k for ext, k in kinds if low.endswith(ext)), "dir")
    base = src.rstrip("/").rsplit("/", 1)[-1] or "data"
    for ext, _ in kinds:
        if base.lower().endswith(ext):
            base = base[: -len(ext)]
            break
    disk: int | None = None
    if profile.scratch_gres:
        size = request.stage_data_gb
        # archives grow when unpacked; without a size, ask for a modest default
        factor = 1.1 if kind == "dir" or kind == "tar" else 3.0
        disk = max(10, int(-(-(size * factor) // 1))) if size is not None else 100
        if profile.scratch_max_gb:
            disk = min(disk, int(profile.scratch_max_gb))
    # the folder name lands inside a double-quoted shell word: keep it to harmless characters
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in base).lstrip(".") or "data"
    return StagePlan(source=src, kind=kind, scratch_var=profile.scratch_var, dest_name=safe,
                     disk_gb=disk)


def _sbatch_lines(request: JobRequest, profile: ClusterProfile, part: Partition, *, nodes: int,
                  tasks_per_node: int, cpus_per_task: int, mem: str | None, seconds: int, gpn: int,
                  gpus_per_task: int, stage: StagePlan | None,
                  signal_s: int | None) -> tuple[tuple[str, str], ...]:
    if profile.scheduler != "slurm":
        return ()
    lines: list[tuple[str, str]] = []
    lines.append(("job-name", job_name_for(request)))
    if request.account:
        lines.append(("account", request.account))
    if not part.implicit:
        lines.append(("partition", part.name))
    lines.append(("nodes", str(nodes)))
    lines.append(("ntasks-per-node", str(tasks_per_node)))
    lines.append(("cpus-per-task", str(cpus_per_task)))
    if mem is not None:
        lines.append(("mem", mem))
    lines.append(("time", format_time(seconds)))
    disk = f"{profile.scratch_gres}:{stage.disk_gb}" if stage and stage.disk_gb and profile.scratch_gres else None
    kind = profile.gpu_request
    if profile.gpus_per_node == 0:
        if disk:
            lines.append(("gres", disk))
    elif kind == "gres_typed":
        lines.append(("gres", f"gpu:{profile.gres_type}:{gpn}" + (f",{disk}" if disk else "")))
    elif kind == "gres":
        lines.append(("gres", f"gpu:{gpn}" + (f",{disk}" if disk else "")))
    else:
        if kind == "gpus_per_task":
            lines.append(("gpus-per-task", str(gpus_per_task)))
        else:
            lines.append(("gpus-per-node", str(gpn)))
        if disk:
            lines.append(("gres", disk))
    lines.append(("output", "%x-%j.out"))
    if signal_s is not None:
        lines.append(("signal", f"B:USR1@{signal_s}"))
        lines.append(("requeue", ""))
        lines.append(("open-mode", "append"))  # a requeued run must not truncate the first's log
    return tuple(lines)


def _env(request: JobRequest, profile: ClusterProfile, *, threads: int,
         device: str) -> tuple[tuple[str, str], ...]:
    # a --profile file outside the profile folders is found by its path, a shipped one by name
    env: list[tuple[str, str]] = [("SCALETRAIN_CLUSTER", request.profile_file or profile.name)]
    if device == "cpu":
        env.append(("SCALETRAIN_DEVICE", "cpu"))
    env.append(("OMP_NUM_THREADS", str(threads)))
    env.extend(sorted(profile.env.items()))
    return tuple(env)


def _cpu_bind(profile: ClusterProfile, *, per_node: bool, gpn: int, whole: bool,
              tasks_per_node: int) -> str | None:
    """LUMI: one task per GCD, each on the CCD nearest its GCD (masks from gpu_cpu_map).

    Only for a whole node with one task per GPU: on a shared node Slurm picks the cores and a
    mask outside them would be refused.
    """
    cmap = profile.gpu_cpu_map
    if not cmap or per_node or not whole or tasks_per_node != len(cmap):
        return None
    masks = []
    for gpu in range(tasks_per_node):
        bits = 0
        for core in cmap[gpu]:
            bits |= 1 << core
        masks.append(f"0x{bits:x}")
    return "mask_cpu:" + ",".join(masks)
