"""The one resolve step: a :class:`Placement` plus what was asked for -> device, backend, CPUs.

``detect`` says who a process is in the job; this module decides, once, what it runs on:

- :func:`read_request`: the ``device``/``backend`` arguments of ``init()``, else the
  ``SCALETRAIN_DEVICE``/``SCALETRAIN_BACKEND``/``SCALETRAIN_PROCS_PER_GPU`` variables a launcher
  sets for its workers (an argument wins);
- :func:`choose_device` and :func:`choose_backend`: the same rules for ``scaletrain.detect()``
  (GPUs counted from the environment, no torch) and ``init()`` (GPUs counted by torch), so
  the two cannot disagree on anything but what torch alone knows;
- :func:`plan_cpus`: the CPU binding (the profile's GPU->cores map travels in
  ``SCALETRAIN_GPU_CPU_MAP``; no profile file is read here) and the intra-op thread count.

Everything here is pure: it reads the mapping it is given and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scaletrain.contract.environ import (BACKEND_VAR, DEVICE_VAR, GPU_CPU_MAP_VAR, PROCS_PER_GPU_VAR, format_cores,
                                         parse_gpu_cpu_map)
from scaletrain.errors import DistEnvError, UsageError
from scaletrain.runtime.affinity import Binding, binding_mode, plan_binding, ranks_share_cpuset
from scaletrain.runtime.device import GpuView, normalize_request, physical_gpu, pick_gpu_index
from scaletrain.runtime.env import Placement
from scaletrain.runtime.threads import ThreadChoice, choose_threads

BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
CPU_HINT = f"set {DEVICE_VAR}=cpu or call scaletrain.init(device='cpu') to run on the CPU"


@dataclass(frozen=True, kw_only=True)
class Request:
    """What this process was asked to run on, normalised.

    Attributes:
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        backend: a torch.distributed backend, or None for the default (nccl on GPUs, else gloo).
        procs_per_gpu: local ranks per GPU (``scaletrain run --procs-per-gpu K``).
    """

    device: str = "auto"
    backend: str | None = None
    procs_per_gpu: int = 1


def normalize_backend(backend: str | None, *, origin: str = "backend=") -> str | None:
    """``backend`` lower-cased and checked against torch.distributed's backends; None stays None."""
    if backend is None:
        return None
    value = backend.strip().lower()
    if value not in BACKENDS:
        raise UsageError(f"{origin}{backend!r} is not a torch.distributed backend",
                         f"use one of {', '.join(BACKENDS)}, or leave it out "
                         "(nccl on GPUs, gloo on the CPU)")
    return value


def read_request(environ: Mapping[str, str], *, device: str | None = None,
                 backend: str | None = None) -> Request:
    """The request from ``init()``'s arguments, else the launcher's ``SCALETRAIN_*`` variables.

    ``scaletrain run --procs-per-gpu K`` asks its workers, through two variables, for gloo
    (NCCL refuses two ranks on one GPU) and K ranks per GPU.
    """
    text = environ.get(PROCS_PER_GPU_VAR, "").strip()
    if text and (not text.isdigit() or int(text) < 1):
        raise DistEnvError(f"{PROCS_PER_GPU_VAR}={text!r} is not a positive integer",
                           "unset it, or launch with scaletrain run --procs-per-gpu K")
    if backend is not None:
        chosen = normalize_backend(backend)
    else:
        chosen = normalize_backend(environ.get(BACKEND_VAR) or None, origin=f"{BACKEND_VAR}=")
    return Request(device=normalize_request(device, environ), backend=chosen,
                   procs_per_gpu=int(text) if text else 1)


def choose_device(placement: Placement, request: Request, view: GpuView, *,
                  torch_gpus: int | None = None, build: str = "torch",
                  under_slurm: bool = False) -> str:
    """The device this process trains on: the one decision ``detect()`` and ``init()`` share.

    ``view`` is what the environment says (visible-GPU variables, Slurm's allocation, device
    nodes). ``torch_gpus`` is torch's own count at ``init()`` (the truth), None for
    ``detect()``, which trusts the view. ``build`` names the torch build in messages.
    Raises DistEnvError when the request or the allocation cannot be met.
    """
    if request.device in ("cpu", "mps"):
        return request.device
    n = view.count if torch_gpus is None else torch_gpus
    who = build if torch_gpus is not None else "this process"
    if n == 0:
        if request.device.startswith("cuda"):
            raise DistEnvError(f"device={request.device!r} asked for but {who} sees no GPU "
                               f"({view.source})", CPU_HINT)
        if torch_gpus is not None and view.from_env and view.count and (under_slurm
                                                                          or view.allocated):
            raise DistEnvError(
                f"GPUs were allocated ({view.source}) but {build} has no GPU support",
                f"install a CUDA or ROCm build of torch, or {CPU_HINT}")
        return "cpu"
    # the count decides; keep the variable's text for messages
    source = view.source if view.from_env or torch_gpus is None else \
        f"torch.cuda.device_count()={n}"
    counted = GpuView(count=n, source=source, ids=view.ids, allocated=view.allocated,
                      from_env=view.from_env)
    if request.device.startswith("cuda:"):
        index = int(request.device.split(":", 1)[1])
        if index >= n:
            raise DistEnvError(f"device={request.device!r} but only {n} "
                               f"GPU{'s' if n != 1 else ''} visible ({source})",
                               f"use an index below {n}, or device='cuda' to pick by local rank")
        return request.device
    index = pick_gpu_index(local_rank=placement.local_rank,
                           local_world_size=placement.local_world_size, view=counted,
                           share_ok=request.backend in ("gloo", "mpi"),
                           procs_per_gpu=request.procs_per_gpu)
    return f"cuda:{index}"


def choose_backend(request: Request, device: str) -> str:
    """nccl on GPUs, gloo elsewhere, unless asked; nccl without a GPU is a UsageError."""
    backend = request.backend or ("nccl" if device.startswith("cuda") else "gloo")
    if backend == "nccl" and not device.startswith("cuda"):
        raise UsageError(f"backend='nccl' needs a GPU but the device is {device!r}",
                         "use backend='gloo' on the CPU, or leave backend out")
    return backend


def gpu_cpu_map(environ: Mapping[str, str]) -> dict[int, tuple[int, ...]] | None:
    """The GPU -> nearest cores map a generated script exported, or None."""
    text = environ.get(GPU_CPU_MAP_VAR, "").strip()
    if not text:
        return None
    try:
        return parse_gpu_cpu_map(text)
    except ValueError as err:
        raise DistEnvError(f"{GPU_CPU_MAP_VAR}={text!r}: {err}",
                           f"unset {GPU_CPU_MAP_VAR}, or write it as '0:0-7;1:8-15'") from None


@dataclass(frozen=True, kw_only=True)
class CpuPlan:
    """The CPU binding (None: leave the affinity alone) and the intra-op threads for a rank."""

    binding: Binding | None
    threads: ThreadChoice

    def facts(self) -> dict[str, str]:
        """What ``Env.extra`` records about this plan."""
        out = {"num_threads": str(self.threads.threads), "threads_from": self.threads.source}
        if self.binding is not None:
            out["cpu_bind"] = format_cores(self.binding.cores)
            out["cpu_bind_reason"] = self.binding.reason
        return out


def plan_cpus(placement: Placement, device: str, environ: Mapping[str, str], *,
              allowed: Sequence[int]) -> CpuPlan:
    """Cores near this rank's GPU (cluster map) or its share of the node, then its threads.

    ``allowed`` is the process's current affinity: what Slurm, taskset or a cgroup allowed.
    An srun task already bound to exactly the planned cores gets no binding (nothing to do).
    """
    binding = None
    if binding_mode(environ) == "auto":
        shared = ranks_share_cpuset(launcher=placement.launcher, allowed=allowed,
                                    local_world_size=placement.local_world_size,
                                    environ=environ)
        binding = plan_binding(allowed=allowed, local_rank=placement.local_rank,
                               local_world_size=placement.local_world_size,
                               gpu=physical_gpu(device, environ),
                               gpu_cpu_map=gpu_cpu_map(environ), shared=shared)
    # torchrun inside an srun task: the task's CPUs are shared by the agent's workers
    per_slurm_task = placement.local_world_size if (placement.launcher == "torchrun"
                                                    and "SLURM_JOB_ID" in environ) else 1
    threads = choose_threads(environ=environ, local_world_size=placement.local_world_size,
                             allowed_cpus=len(allowed),
                             bound_cpus=len(binding.cores) if binding else None,
                             per_slurm_task=per_slurm_task)
    return CpuPlan(binding=binding, threads=threads)
