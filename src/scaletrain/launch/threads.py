"""CPU threads per worker: share the cores this launcher was given among its local workers.

Without this, every worker's intra-op pool (OpenMP/MKL) starts one thread per core, so N
workers on C cores run N*C threads and thrash. torchrun's answer is ``OMP_NUM_THREADS=1``
whenever it is unset, which wastes all but N cores. The seeds' multi-CPU advice is the
right one: threads = the cores you were given (``--cpus-per-task``) / processes on them.
torch reads ``OMP_NUM_THREADS`` when its thread pool starts, so setting the variable in the
worker's environment is what makes ``torch.get_num_threads()`` agree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ThreadBudget:
    """Threads each local worker gets and where the number came from (for messages)."""

    per_worker: int
    source: str  # "OMP_NUM_THREADS (user)", "SLURM_CPUS_PER_TASK=8 / 2 workers", ...
    user_set: bool = False


def available_cores(environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Cores this launcher may use and why: Slurm's ``SLURM_CPUS_PER_TASK`` or the affinity mask."""
    env = os.environ if environ is None else environ
    slurm = env.get("SLURM_CPUS_PER_TASK", "").strip()
    if slurm.isdigit() and int(slurm) > 0:
        return int(slurm), f"SLURM_CPUS_PER_TASK={slurm}"
    try:
        cores = len(os.sched_getaffinity(0))  # honours taskset/cgroup pinning, unlike cpu_count()
        return cores, f"{cores} cores in this process's affinity mask"
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
        return cores, f"{cores} cores"


def thread_budget(local_workers: int, environ: Mapping[str, str] | None = None) -> ThreadBudget:
    """Threads per worker for ``local_workers`` processes on this node; a user's value wins."""
    env = os.environ if environ is None else environ
    user = env.get("OMP_NUM_THREADS", "").strip()
    if user:
        return ThreadBudget(per_worker=int(user) if user.isdigit() else 1,
                            source=f"OMP_NUM_THREADS={user} (set by you)", user_set=True)
    cores, why = available_cores(env)
    per = max(1, cores // max(1, local_workers))
    return ThreadBudget(per_worker=per, source=f"{why} / {local_workers} local workers")
