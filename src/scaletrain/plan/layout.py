"""The arithmetic of the resources stage (``scaletrain.plan.resources``): nodes and GPUs, the
partition, tasks, CPUs, memory, binding.

Each function is pure and small; the rules:

- GPUs that fit one node run on one node; more run on whole nodes. A GPU count that is not a
  multiple of the node's GPUs is refused unless the partition shares nodes (then the GPUs are
  spread evenly, with a note: the CSC guide says split nodes are for testing only).
- The partition: the named one, else the first non-test partition whose limits take the job
  (``Resources.check``), preferring whole-node partitions for whole nodes and shared ones for
  part of a node.
- CPUs per task = the node's cores per GPU x GPUs per task; a whole-node allocation hands out
  every core. Memory per the profile: proportional to GPUs, the whole node (--mem=0), or none.
- CPU binding (LUMI): each task on the cores nearest its GPU, only when the job owns every
  core of the node and the masks name exactly the task's CPUs; else Slurm binds.
"""

from __future__ import annotations

from scaletrain.clusters.profile import ClusterProfile, Partition, format_time
from scaletrain.clusters.resources import ERROR, Resources
from scaletrain.errors import PlanError, ProfileError, UsageError
from scaletrain.plan.request import JobRequest, format_mem

SPLIT_NOTE_SOURCE = "CSC guide 'Multi-GPU and multi-node machine learning'"


def slots(profile: ClusterProfile) -> int:
    """GPUs per node; without GPUs ("local"), a "GPU" is a CPU worker: at most one per core."""
    return profile.gpus_per_node if profile.gpus_per_node > 0 else profile.cores_per_node


def _split_gpus(gpus: int, per_node: int) -> tuple[int, int]:
    """Fewest nodes that hold ``gpus`` evenly (same count on every node, at most per_node).

    The fewest nodes are the most GPUs per node that divide ``gpus``: at most ``per_node``
    tries, however large the request (counting nodes up from the minimum took ``gpus`` tries
    for a prime number of GPUs).
    """
    gpn = next(g for g in range(min(per_node, gpus), 0, -1) if gpus % g == 0)
    return gpus // gpn, gpn


def _nearest_multiples(gpus: int, per_node: int) -> str:
    lo, hi = (gpus // per_node) * per_node, (gpus // per_node + 1) * per_node
    return f"--gpus {lo} or --gpus {hi}" if lo else f"--gpus {hi}"


def _why_not(profile: ClusterProfile, part: Partition, *, nodes: int, gpn: int, seconds: int) -> str | None:
    """The first limit of ``part`` the job breaks (the shared check), or None when it fits."""
    probe = Resources(nodes=nodes, gpus_per_node=gpn, tasks_per_node=1, cpus_per_task=1,
                      seconds=seconds, partition=part.name)
    errors = [v for v in probe.check(profile) if v.severity == ERROR and v.rule in ("partition-limit", "time-limit")]
    return errors[0].message if errors else None


def choose_partition(profile: ClusterProfile, *, nodes: int, gpn: int, seconds: int) -> Partition:
    """The partition for a job of ``nodes`` x ``gpn`` GPUs (PlanError when none takes it)."""
    gpu_job = profile.gpus_per_node > 0 and gpn > 0
    candidates = [p for p in profile.partitions.values()
                  if not p.test and (p.gpus == gpu_job or p.implicit or profile.gpus_per_node == 0)]
    if not candidates and not gpu_job:
        # the GPU partitions are no help to a CPU-only job: say where such jobs go instead
        raise PlanError(f"{profile.name} has no CPU partition for a CPU-only job (--cpus)",
                        profile.cpu_jobs or "plan it for a cluster whose profile lists a CPU partition, or give "
                        "the job GPUs (--gpus N)")
    if not candidates:
        kind = "GPU"
        raise ProfileError(f"profile {profile.name!r} has no {kind} partition",
                           f"name the partition to run on with --partition ({', '.join(profile.partitions)}), "
                           f"or add a [partitions.NAME] table with gpus = {'true' if gpu_job else 'false'} "
                           "to the profile")
    why = {p.name: _why_not(profile, p, nodes=nodes, gpn=gpn, seconds=seconds) for p in candidates}
    fitting = [p for p in candidates if why[p.name] is None]
    if not fitting:
        if all(p.max_seconds is not None and seconds > p.max_seconds for p in candidates):
            longest = max(candidates, key=lambda p: p.max_seconds or 0)
            raise PlanError(f"--time {format_time(seconds)} is above every GPU partition's limit on "
                            f"{profile.name} (longest: {longest.name}, {longest.max_time})",
                            f"ask --time {longest.max_time} or less and checkpoint, with --requeue "
                            "to continue in the next job")
        sizes = [min(p.max_gpus or 10**9, (p.max_nodes or 10**9) * slots(profile)) for p in candidates]
        most = max(sizes) if gpu_job else 10**9
        raise PlanError(f"no partition on {profile.name} takes {nodes * gpn} GPUs on {nodes} node"
                        f"{'s' if nodes != 1 else ''} ({'; '.join(f'{k}: {v}' for k, v in why.items())})",
                        f"ask for at most {most} GPUs (the largest job a partition here takes)" if most < nodes * gpn
                        else "ask for fewer GPUs, or name a partition with --partition")
    whole = gpn == slots(profile)
    preferred = [p for p in fitting if p.whole_node == whole] or fitting
    defaults = [p for p in preferred if p.default]
    return defaults[0] if defaults else preferred[0]


def nodes_and_gpus(request: JobRequest, profile: ClusterProfile, named: Partition | None,
                   seconds: int) -> tuple[int, int, list[str]]:
    """(nodes, GPUs per node, notes) for the request; a count the centre does not take is refused."""
    nodes, gpn, notes = _nodes_and_gpus(request, profile, named, seconds)
    allowed = profile.gpus_per_node_allowed
    if allowed and gpn and gpn not in allowed:
        counts = " or ".join(str(n) for n in allowed)
        raise PlanError(f"{profile.name} takes {counts} GPUs per node, not {gpn}",
                        f"ask for {counts} GPUs per node (e.g. --gpus {allowed[0]}, or --nodes M for whole nodes)")
    return nodes, gpn, notes


def _nodes_and_gpus(request: JobRequest, profile: ClusterProfile, named: Partition | None,
                    seconds: int) -> tuple[int, int, list[str]]:
    per = slots(profile)
    if request.cpus is not None and profile.scheduler == "slurm":
        return request.nodes or 1, 0, []                   # a CPU-only job
    if request.nodes is not None:
        gpn = request.gpus_per_node if request.gpus_per_node is not None else per
        if gpn > per:
            raise PlanError(f"a {profile.name} node has {per} GPUs, not {gpn}",
                            f"use --gpus-per-node {per} or fewer, and more --nodes")
        return request.nodes, gpn, []
    gpus = int(request.gpus or 0)
    if profile.scheduler == "none" and gpus > per:
        raise PlanError(f"this machine has {per} cores; {gpus} worker processes would oversubscribe it",
                        f"use --gpus {per} or fewer with --cluster local")
    if gpus <= per:
        return 1, gpus, []
    if gpus % per == 0:
        return gpus // per, per, []
    # not whole nodes: only a partition that shares nodes can take it
    nodes, gpn = _split_gpus(gpus, per)
    part = named or choose_partition(profile, nodes=nodes, gpn=gpn, seconds=seconds)
    if part.whole_node:
        raise PlanError(f"{gpus} GPUs is not a multiple of the {per} GPUs of a {profile.name} node "
                        f"(partition {part.name!r} allocates whole nodes)",
                        f"use {_nearest_multiples(gpus, per)}, or --nodes M --gpus-per-node G")
    return nodes, gpn, [f"{gpus} GPUs spread as {nodes} nodes x {gpn}: communication between nodes is "
                        f"slower than inside one; prefer {_nearest_multiples(gpus, per)} "
                        f"({SPLIT_NOTE_SOURCE})"]


def tasks(request: JobRequest, profile: ClusterProfile, *, per_node: bool, gpn: int) -> tuple[int, int, int]:
    """(Slurm tasks per node, GPUs per task, training processes per node).

    One process per GPU by default; ``gpus_per_proc`` G makes one process drive G GPUs,
    ``procs_per_gpu`` K puts K processes on each GPU (MPS). A per-node launcher runs one task
    that starts the processes itself; a CPU-only job runs one process per node.
    """
    g, k = request.gpus_per_proc, request.procs_per_gpu
    if g > 1 and k > 1:
        raise UsageError("--gpus-per-proc and --procs-per-gpu exclude each other",
                         "one process drives several GPUs, or several processes share one GPU")
    if gpn == 0:
        return 1, 0, 1
    if gpn % g:
        raise PlanError(f"{gpn} GPUs per node do not split into processes of {g} GPUs",
                        f"ask a multiple of {g} GPUs per node")
    procs = gpn * k // g
    if (g > 1 or k > 1) and per_node and profile.scheduler == "slurm":
        # a per-node launcher starts one worker per GPU; these shapes need one Slurm task per process
        raise UsageError(f"--{'gpus-per-proc' if g > 1 else 'procs-per-gpu'} needs a launcher with one task "
                         "per process", "use --launcher scaletrain, srun, mpi or lightning")
    if per_node or profile.scheduler == "none":
        return 1, gpn, procs
    # MPS: several tasks share a GPU, so the GPU request cannot be per task
    return procs, (g if k == 1 else 0), procs


def cpus_per_task(request: JobRequest, profile: ClusterProfile, *, tasks_per_node: int, gpn: int,
                  whole_node: bool) -> int:
    """CPU cores per Slurm task: the node's cores per GPU for the task's share of the GPUs."""
    if profile.scheduler == "none":
        return profile.cores_per_node                      # the whole machine
    if gpn == 0:
        return request.cpus or 1
    if request.cpus_per_gpu is not None:
        return max(1, request.cpus_per_gpu * gpn // tasks_per_node)
    if whole_node or profile.mem_request == "whole_node":
        return max(1, profile.cores_per_node // tasks_per_node)   # hand out the whole node
    # the centre's per-GPU share where it is smaller than the node's cores per GPU, so the job is
    # not billed for a larger share than its GPUs (the Alliance's bundles are the node's share)
    per_gpu = min(profile.cores_per_gpu, profile.max_cores_per_gpu or profile.cores_per_gpu)
    return max(1, per_gpu * gpn // tasks_per_node)


def memory(request: JobRequest, profile: ClusterProfile, *, gpn: int,
           cpus: int) -> tuple[str | None, float | None]:
    """(the --mem value or None for no line, GB per node or None when unknown; 0 = whole node)."""
    if gpn == 0 and profile.mem_request == "proportional" and profile.cores_per_node:
        # a CPU-only job: the CPU nodes' memory per core where the profile knows it (Narval's CPU
        # nodes have 3.9 GB a core; its GPU nodes' 10.4 asked 2.5x what the job is billed for)
        per_core = profile.cpu_mem_per_core_gb or profile.mem_per_node_gb / profile.cores_per_node
        return format_mem(per_core * cpus), None
    if request.mem_per_gpu_gb is not None:
        gb = request.mem_per_gpu_gb * gpn
    elif profile.mem_request == "proportional":
        # the per-GPU share times GPUs, never above what a node offers (Graham: 2 x 64000M > node)
        gb = min(profile.mem_per_gpu * gpn, profile.mem_per_node_gb or float("inf"))
    elif profile.mem_request == "whole_node" and profile.scheduler == "slurm":
        return "0", profile.mem_per_node_gb or None       # Slurm: all the memory of each node
    else:
        return None, None
    return format_mem(gb), gb


def cpu_bind(profile: ClusterProfile, *, per_node: bool, tasks_per_node: int, cpus_per_task: int,
             owns_node: bool) -> tuple[str | None, str | None]:
    """(srun --cpu-bind value or None, a note when binding is left to Slurm).

    A mask must name only CPUs the step has, or Slurm refuses it and the step never starts.
    So masks are written only when the job owns every core of the node, and each one names
    ``cpus_per_task`` cores nearest its GPU.
    """
    cmap = profile.gpu_cpu_map
    if not cmap or per_node or tasks_per_node != len(cmap):
        return None, None
    if not owns_node or any(cpus_per_task > len(cmap[g]) for g in range(tasks_per_node)):
        return None, ("CPU binding left to Slurm: the cores nearest each GPU are bound only when the job "
                      f"owns whole nodes and asks at most {min(len(c) for c in cmap.values())} cores per GPU")
    masks = []
    for gpu in range(tasks_per_node):
        bits = 0
        for core in cmap[gpu][:cpus_per_task]:
            bits |= 1 << core
        masks.append(f"0x{bits:x}")
    return "mask_cpu:" + ",".join(masks), None


def partition_family(profile: ClusterProfile, name: str | None) -> str:
    """A name shared by a cluster's GPU partitions across guide revisions (LUMI eap/small-g/standard-g)."""
    if name is None:
        return "default"
    if profile.name == "lumi" and name in ("eap", "small-g", "standard-g", "dev-g"):
        return "lumi-g"
    return name


def launch_notes(launcher: str, nodes: int, gpn: int) -> list[str]:
    """What a launcher that starts the workers itself must be told of this layout."""
    notes = []
    if launcher == "lightning":
        notes.append(f"Lightning: Trainer(devices={gpn}, num_nodes={nodes}, strategy='ddp') must match "
                     "this allocation (CSC guide 'Multi-GPU and multi-node machine learning')")
    if launcher == "deepspeed" and nodes > 1:
        notes.append("deepspeed launcher: one task per node, nodes joined with --no_ssh and "
                     "--node_rank=$SLURM_NODEID (needs DeepSpeed >= 0.14)")
    return notes
