"""Which device a process trains on: GPUs visible to it, the one its local rank picks, checks.

:func:`gpu_view` reads only environment variables and device nodes, so
``scaletrain.detect()`` can count GPUs without importing torch: ``CUDA_VISIBLE_DEVICES``
(or ROCm's ``ROCR_VISIBLE_DEVICES``/``HIP_VISIBLE_DEVICES``), then Slurm's
``SLURM_GPUS_ON_NODE``, then ``/dev/nvidiaN`` nodes and AMD's KFD topology; :func:`torch_gpus`
is torch's own count at ``init()``. The decision itself (which GPU, and whether the allocation
can hold the local ranks) is ``runtime.resolve.choose_device``, one function for both.
ROCm builds of torch expose HIP devices through ``torch.cuda``, so both vendors are
``cuda:N`` here.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from scaletrain.contract.environ import DEVICE_VAR
from scaletrain.errors import DistEnvError, UsageError

VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
# Set by Slurm when the job or step holds GPUs on this node.
SLURM_GPU_VARS = ("SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
# Set by `scaletrain run --procs-per-gpu K` for its workers (the seeds' MPS recipe).


@dataclass(frozen=True, kw_only=True)
class GpuView:
    """The GPUs this process may use, as far as the environment tells.

    Attributes:
        count: number of visible GPUs (0 when none).
        source: where the number came from, e.g. ``CUDA_VISIBLE_DEVICES=0,1``.
        ids: the visible list's entries (physical indices or UUIDs), when a variable gave one.
        allocated: GPUs the scheduler allocated to the job on this node (None if unknown).
        from_env: True when a variable (not a device-node probe) gave the count.
    """

    count: int
    source: str
    ids: tuple[str, ...] = ()
    allocated: int | None = None
    from_env: bool = False


def parse_visible(value: str) -> tuple[str, ...]:
    """Entries of a ``CUDA_VISIBLE_DEVICES``-style list, as CUDA reads it.

    CUDA stops at the first invalid entry and ``-1`` hides every device, so ``"0,1,-1,2"``
    names two devices, ``""`` and ``"NoDevFiles"`` (old Slurm) none.
    """
    ids: list[str] = []
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-") or item == "NoDevFiles":
            break
        ids.append(item)
    return tuple(ids)


def _slurm_allocated(environ: Mapping[str, str]) -> tuple[int | None, str]:
    for name in SLURM_GPU_VARS:
        value = environ.get(name, "").strip()
        if not value:
            continue
        if name == "SLURM_GPUS_ON_NODE":
            if value.isdigit():
                return int(value), f"{name}={value}"
            continue
        ids = parse_visible(value)
        return len(ids), f"{name}={value}"
    return None, ""


def _probe_device_nodes() -> tuple[int, str]:
    """GPUs from device nodes, without a driver call: NVIDIA ``/dev/nvidiaN``, AMD KFD nodes."""
    nvidia = [p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)]
    if nvidia:
        return len(nvidia), f"{len(nvidia)} /dev/nvidiaN device nodes"
    amd = 0
    for props in glob.glob("/sys/class/kfd/kfd/topology/nodes/*/properties"):
        try:
            text = open(props, encoding="ascii", errors="replace").read()
        except OSError:
            continue
        # CPU nodes of the KFD topology report simd_count 0; GPU (GCD) nodes do not.
        match = re.search(r"^simd_count\s+(\d+)", text, re.MULTILINE)
        if match and int(match.group(1)) > 0:
            amd += 1
    if amd:
        return amd, f"{amd} AMD GPUs in /sys/class/kfd"
    return 0, "no GPU device nodes"


def gpu_view(environ: Mapping[str, str] | None = None, *, probe: bool = True) -> GpuView:
    """What the environment says about this process's GPUs; never imports torch."""
    env = os.environ if environ is None else environ
    allocated, alloc_src = _slurm_allocated(env)
    for name in VISIBLE_VARS:
        if name in env:
            ids = parse_visible(env[name])
            return GpuView(count=len(ids), source=f"{name}={env[name]}", ids=ids,
                           allocated=allocated, from_env=True)
    if allocated is not None:
        return GpuView(count=allocated, source=alloc_src, allocated=allocated, from_env=True)
    if not probe:
        return GpuView(count=0, source="no GPU variables")
    count, source = _probe_device_nodes()
    return GpuView(count=count, source=source)


def pick_gpu_index(*, local_rank: int, local_world_size: int, view: GpuView,
                   share_ok: bool = False, procs_per_gpu: int = 1) -> int:
    """The visible-GPU index for ``local_rank``, or DistEnvError when the node is over-subscribed.

    Enough GPUs for every local rank: index = local rank (torchrun, srun with all GPUs
    visible). One GPU visible to several local ranks is fine when Slurm bound one GPU to each
    task (``--gpus-per-task``: the node holds enough GPUs) or when sharing was asked for
    (``share_ok``: gloo/MPI backends, CUDA MPS); NCCL cannot put two ranks on one GPU.
    ``procs_per_gpu`` K > 1 (``scaletrain run --procs-per-gpu K``) places local ranks
    K at a time on each GPU: index = local_rank // K.
    """
    n = view.count
    if procs_per_gpu > 1 and share_ok and n * procs_per_gpu >= local_world_size:
        return local_rank // procs_per_gpu
    if n >= local_world_size:
        return local_rank
    if n == 1 and (share_ok or (view.allocated or 0) >= local_world_size):
        return 0
    fix = (f"--ntasks-per-node={n} (one task per GPU) or --nproc-per-node {n}" if n > 1 else
           "one process per GPU (--gpus-per-task=1), or init(backend='gloo') to share the GPU")
    raise DistEnvError(
        f"{local_world_size} processes on this node but {n} GPU{'s' if n != 1 else ''} "
        f"visible ({view.source})", f"{fix}")


def torch_gpus() -> tuple[int, str]:
    """torch's own GPU count (0 without GPU support) and a build description for messages."""
    import torch

    build = f"torch {torch.__version__}"
    if not torch.cuda.is_available():
        return 0, build
    return int(torch.cuda.device_count()), build


def normalize_request(device: str | None, environ: Mapping[str, str]) -> str:
    """``device`` argument or ``SCALETRAIN_DEVICE``, checked: auto, cpu, cuda, cuda:N, mps."""
    value = device if device is not None else environ.get(DEVICE_VAR, "").strip() or "auto"
    value = value.strip().lower()
    if value == "gpu":
        value = "cuda"
    if value in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d+", value):
        return value
    origin = "device=" if device is not None else f"{DEVICE_VAR}="
    raise UsageError(f"{origin}{value!r} is not a device scaletrain knows",
                     "use 'auto', 'cpu', 'cuda' or 'cuda:N'")


def physical_gpu(device: str, environ: Mapping[str, str]) -> int | None:
    """The node-level GPU number behind ``cuda:N`` (for CPU-affinity maps), when known.

    With ``ROCR_VISIBLE_DEVICES=3`` (LUMI's per-task GPU selection) ``cuda:0`` is GCD 3.
    """
    if not device.startswith("cuda:"):
        return None
    index = int(device.split(":", 1)[1])
    for name in VISIBLE_VARS:
        if name in environ:
            ids = parse_visible(environ[name])
            if index < len(ids) and ids[index].isdigit():
                return int(ids[index])
            return None  # a UUID/MIG name, or a list torch disagrees with
    return index
