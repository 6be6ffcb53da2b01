"""Intra-op CPU threads for this process: the user's choice, Slurm's, or a fair share.

Without a limit every process on a node starts one OpenMP/MKL thread per core, so N ranks on
C cores run N*C threads and thrash. The seeds' advice (003: ``torch.set_num_threads(
int(os.environ['SLURM_CPUS_PER_TASK']))``) generalises to: the cores this task was given,
divided by the processes sharing them. A user's ``OMP_NUM_THREADS`` always wins, and we never
write ``OMP_NUM_THREADS`` ourselves: the variable belongs to the user and the launcher.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ThreadChoice:
    """How many intra-op threads, and why (for ``Env.extra`` and messages)."""

    threads: int
    source: str


def _positive(value: str | None) -> int | None:
    text = (value or "").strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    return None


def choose_threads(*, environ: Mapping[str, str], local_world_size: int,
                   allowed_cpus: int, bound_cpus: int | None = None,
                   per_slurm_task: int = 1) -> ThreadChoice:
    """Pure: threads for one process.

    Order: ``OMP_NUM_THREADS`` (user or launcher), ``SLURM_CPUS_PER_TASK``, the cores this
    process was bound to (``bound_cpus``, after :mod:`affinity`), else the cores it may use
    divided by the processes on this node (at least 1). ``per_slurm_task`` is how many
    processes share one Slurm task's CPUs: 1 for srun tasks, the local world size for
    torchrun started once per node (its workers split the task's cores).
    """
    omp = _positive(environ.get("OMP_NUM_THREADS"))
    if omp is not None:
        return ThreadChoice(threads=omp, source=f"OMP_NUM_THREADS={omp}")
    slurm = _positive(environ.get("SLURM_CPUS_PER_TASK"))
    if slurm is not None:
        share = max(1, slurm // max(1, per_slurm_task))
        why = f" / {per_slurm_task} processes" if per_slurm_task > 1 else ""
        return ThreadChoice(threads=share, source=f"SLURM_CPUS_PER_TASK={slurm}{why}")
    if bound_cpus:
        return ThreadChoice(threads=bound_cpus, source=f"{bound_cpus} cores bound to this rank")
    share = max(1, allowed_cpus // max(1, local_world_size))
    return ThreadChoice(threads=share,
                        source=f"{allowed_cpus} cores / {local_world_size} local processes")


def allowed_cpus() -> Sequence[int]:
    """The CPUs this process may run on (cgroup/taskset/Slurm binding), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def apply_threads(choice: ThreadChoice) -> int:
    """Set torch's intra-op threads; returns the previous count so it can be restored."""
    import torch

    previous = torch.get_num_threads()
    if previous != choice.threads:
        torch.set_num_threads(choice.threads)
    return previous
