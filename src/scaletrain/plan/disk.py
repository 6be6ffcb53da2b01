"""Node-local disk, in the resources stage: the data ``--stage-data`` copies there, the venv a job
builds there, and ZeRO's NVMe offload (``--deepspeed-config nvme``).

Each is checked against what the node offers: the disk a user may fill (``scratch_max_gb``, Roihu:
150 GiB per user), or, where the node's "scratch" is memory (Trillium, LUMI), the job's own memory.
Where the cluster sells the disk as a GRES (Puhti/Mahti ``--gres=nvme:GB``), the GB to ask for.
"""

from __future__ import annotations

import math

from scaletrain.clusters.model import ClusterProfile
from scaletrain.errors import PlanError
from scaletrain.plan.records import StagePlan
from scaletrain.plan.request import JobRequest

# ZeRO-3 offload to NVMe keeps fp32 master weights and Adam's two moments (12 bytes a parameter)
# and the 16-bit parameters (2) on the disk, sharded over the nodes; a quarter more for DeepSpeed's
# swap buffers, and never less than the guides' usual request
_NVME_BYTES_PER_PARAM = 14 * 1.25
_NVME_MIN_GB = 100


# What the job's own venv takes where the job builds it in node-local scratch: torch with its
# CUDA/ROCm libraries. An estimate (the CPU-only torch 2.13 here is 0.75 GB; GPU builds carry
# several GB of vendor libraries): unconfirmed, so the check errs on the side of refusing.
JOB_VENV_GB = 5.0


def venv_in_scratch(request: JobRequest, profile: ClusterProfile) -> bool:
    """The job builds its venv in node-local scratch that is memory (Trillium): it takes job memory."""
    own_env = request.venv or request.conda or request.container or request.python
    return bool(profile.scratch_in_memory and profile.python_env_lines and not own_env)


def job_memory_gb(profile: ClusterProfile, mem_gb: float | None, gpn: int) -> float | None:
    """The memory each node of the job has (``mem_gb``: what ``layout.memory`` asked for, whole node
    included); where memory requests are ignored (Trillium: "single-GPU jobs get 1/4 of the
    memory"), its GPUs' share of the node."""
    if mem_gb:
        return mem_gb
    if profile.mem_per_node_gb and profile.gpus_per_node and gpn:
        return profile.mem_per_node_gb * min(gpn, profile.gpus_per_node) / profile.gpus_per_node
    return profile.mem_per_node_gb or None


def stage_plan(request: JobRequest, profile: ClusterProfile, *, job_mem_gb: float | None,
               venv_in_scratch: bool) -> StagePlan | None:
    """How ``--stage-data`` reaches node-local scratch, or None without it.

    Where that scratch is memory (Trillium, LUMI), the staged data must fit in the job's memory
    per node (``job_mem_gb``, see :func:`job_memory_gb`), less the venv the job builds there
    (``venv_in_scratch``): a job is killed when its RAM disk outgrows its memory, however large
    the node is.
    """
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
    size = request.stage_data_gb
    factor = 1.1 if kind in ("dir", "tar") else 3.0     # archives grow when unpacked
    if size is not None and not profile.scratch_gres:
        need = size * factor
        venv = JOB_VENV_GB if venv_in_scratch else 0.0
        room = profile.scratch_max_gb or (job_mem_gb - venv if profile.scratch_in_memory and job_mem_gb else None)
        if room is not None and need > room:   # no stated room (a node's own NVMe): nothing to check against
            where = (f"{profile.scratch_var} is memory on {profile.name}: the job has {job_mem_gb:.0f} GB per node"
                     + (f", about {venv:g} GB of it for the venv it builds there" if venv else "")
                     if profile.scratch_in_memory else f"{profile.scratch_var} holds {room:g} GB on {profile.name}")
            raise PlanError(f"--stage-data {src} needs about {need:.0f} GB on each node, but {where}",
                            "read the data from the shared scratch file system instead (leave out --stage-data), "
                            "stage a smaller subset, or ask for more memory (more GPUs or whole nodes)")
    if profile.scratch_gres:
        # without a size (the data is not reachable from here), ask for a modest default
        disk = max(10, int(-(-(size * factor) // 1))) if size is not None else 100
        if profile.scratch_max_gb:
            disk = min(disk, int(profile.scratch_max_gb))
    # the folder name lands inside a double-quoted shell word: keep it to harmless characters
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in base).lstrip(".") or "data"
    return StagePlan(source=src, kind=kind, scratch_var=profile.scratch_var, dest_name=safe, disk_gb=disk)


def nvme_disk(request: JobRequest, profile: ClusterProfile, *, nodes: int) -> int | None:
    """``--deepspeed-config nvme``: the GB of node-local disk to request where it is a GRES (None where
    the disk needs no request); PlanError where the nodes have no such disk or too little of it."""
    if not profile.scratch_var or profile.scratch_in_memory:
        why = "their local /tmp is memory" if profile.scratch_in_memory else "they have no node-local disk"
        raise PlanError(f"--deepspeed-config nvme needs node-local NVMe, and {profile.name}'s nodes do not "
                        f"have it ({why})",
                        "use --deepspeed-config offload (optimizer state and parameters in CPU memory)")
    if not profile.scratch_gres:
        _check_quota(request, profile, nodes=nodes)
        return None
    need = _NVME_MIN_GB
    if request.params:
        need = max(need, math.ceil(request.params * _NVME_BYTES_PER_PARAM / nodes / 1e9))
    if profile.scratch_max_gb and need > profile.scratch_max_gb:
        raise PlanError(f"ZeRO offload to NVMe needs about {need} GB of local disk per node, more than "
                        f"{profile.name}'s {int(profile.scratch_max_gb)} GB",
                        "use more nodes (the offloaded state is sharded over them), or --deepspeed-config offload")
    return need


def _check_quota(request: JobRequest, profile: ClusterProfile, *, nodes: int) -> None:
    """PlanError when the offloaded model state (the summary's table: one replica, sharded over
    the nodes) does not fit the node-local disk a user may fill (Roihu: 150 GiB per user)."""
    if not (request.params and profile.scratch_max_gb):
        return
    from scaletrain.parallel.memory import estimate_memory   # lazily: plan imports stay small

    replica = estimate_memory(int(request.params)).replica
    quota = profile.scratch_max_gb * 1024 ** 3
    if replica / nodes <= quota:
        return
    fit = math.ceil(replica / quota)
    raise PlanError(f"ZeRO offload to NVMe of {request.params:.3g} parameters needs about "
                    f"{replica / nodes / 1024 ** 3:.0f} GiB of local disk per node on {nodes} node"
                    f"{'s' if nodes != 1 else ''}, but {profile.scratch_var} on {profile.name} holds "
                    f"{profile.scratch_max_gb:g} GiB per user",
                    f"use {fit} nodes or more (the offloaded state is sharded over them), or --deepspeed-config "
                    "offload (CPU memory)")
