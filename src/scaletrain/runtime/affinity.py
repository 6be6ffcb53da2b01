"""Bind this process to CPU cores: near its GPU when the cluster has a map, else its share.

Seed 002 ("Set up CPU bindings"): under torchrun Slurm cannot bind the workers, so the
training script must, or every rank's data loading wanders across the whole node and away
from its GPU. Two rules, never leaving what Slurm (or taskset/cgroups) allowed:

1. The cluster has a GPU -> cores map (LUMI: each GCD is attached to one CCD of 8 cores;
   a generated script exports the profile's map as ``SCALETRAIN_GPU_CPU_MAP``): bind to the
   cores nearest this rank's GPU, intersected with the allowed set.
2. Several local ranks share one allowed cpuset (torchrun, or srun without task binding):
   give each rank its contiguous slice, so ranks do not fight over cores.

Otherwise nothing changes. ``SCALETRAIN_CPU_BIND=none`` turns binding off.
:func:`plan_binding` is pure; :func:`apply_binding` is the thin applier.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scaletrain.contract.environ import BIND_VAR
from scaletrain.errors import UsageError



@dataclass(frozen=True, kw_only=True)
class Binding:
    """The cores chosen for this rank and why."""

    cores: tuple[int, ...]
    reason: str


def share_of(allowed: Sequence[int], *, local_rank: int, local_world_size: int) -> tuple[int, ...]:
    """Contiguous slice ``local_rank`` of ``allowed`` split ``local_world_size`` ways.

    Remainder cores go to the first slices (10 cores, 4 ranks: 3, 3, 2, 2). Empty when
    there are fewer cores than ranks.
    """
    cores = sorted(set(allowed))
    n = max(1, local_world_size)
    if len(cores) < n or not 0 <= local_rank < n:
        return ()
    base, extra = divmod(len(cores), n)
    start = local_rank * base + min(local_rank, extra)
    size = base + (1 if local_rank < extra else 0)
    return tuple(cores[start:start + size])


def plan_binding(*, allowed: Sequence[int], local_rank: int, local_world_size: int,
                 gpu: int | None = None,
                 gpu_cpu_map: Mapping[int, Sequence[int]] | None = None,
                 shared: bool = True) -> Binding | None:
    """Pure: the cores this rank should run on, or None to leave the affinity as it is.

    ``allowed`` is the process's current affinity (what Slurm gave); the result is always a
    non-empty subset of it. ``gpu`` is the node-level GPU number of this rank's device.
    ``shared`` says the local ranks all see the same ``allowed`` set.
    """
    allowed_set = set(allowed)
    if not allowed_set:
        return None
    if gpu_cpu_map and gpu is not None and gpu in gpu_cpu_map:
        near = tuple(sorted(allowed_set.intersection(gpu_cpu_map[gpu])))
        if near and set(near) != allowed_set:
            return Binding(cores=near, reason=f"cores nearest GPU {gpu} (cluster map)")
        if near:
            return None  # Slurm already bound us to exactly those cores
    if shared and local_world_size > 1:
        cores = share_of(sorted(allowed_set), local_rank=local_rank,
                         local_world_size=local_world_size)
        if cores and set(cores) != allowed_set:
            return Binding(cores=cores,
                           reason=f"share {local_rank + 1}/{local_world_size} of "
                                  f"{len(allowed_set)} allowed cores")
    return None


def binding_mode(environ: Mapping[str, str]) -> str:
    """``SCALETRAIN_CPU_BIND``: ``auto`` (default) or ``none``."""
    value = environ.get(BIND_VAR, "auto").strip().lower() or "auto"
    if value not in ("auto", "none"):
        raise UsageError(f"{BIND_VAR}={value!r} is not 'auto' or 'none'",
                         f"unset {BIND_VAR}, or set it to none to keep the CPU binding as is")
    return value


def ranks_share_cpuset(*, launcher: str, allowed: Sequence[int], local_world_size: int,
                       environ: Mapping[str, str]) -> bool:
    """Whether this node's local ranks likely see the same allowed cpuset.

    torchrun/local workers fork from one agent, so they share its mask. srun tasks share one
    when the set is larger than one task's CPUs (no task binding). MPI ranks share only when
    the launcher did not bind them (the mask is every online CPU).
    """
    if launcher in ("torchrun", "local"):
        return True
    if launcher == "slurm":
        per_task = environ.get("SLURM_CPUS_PER_TASK", "").strip()
        cpt = int(per_task) if per_task.isdigit() and int(per_task) > 0 else 1
        return len(set(allowed)) >= local_world_size * cpt
    return len(set(allowed)) >= (os.cpu_count() or 1)


def apply_binding(binding: Binding) -> set[int] | None:
    """Bind this process to ``binding.cores``; returns the previous mask (None if unsupported)."""
    try:
        previous = set(os.sched_getaffinity(0))
        os.sched_setaffinity(0, binding.cores)
    except (AttributeError, OSError):  # not Linux, or the cores vanished meanwhile
        return None
    return previous
