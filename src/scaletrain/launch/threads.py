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

from scaletrain.runtime.threads import allowed_cpus, choose_threads


@dataclass(frozen=True, kw_only=True)
class ThreadBudget:
    """Threads each local worker gets and where the number came from (for messages)."""

    per_worker: int   # 0: not known (a value of the user's that OpenMP ignores)
    source: str  # "OMP_NUM_THREADS (user)", "SLURM_CPUS_PER_TASK=8 / 2 workers", ...
    user_set: bool = False


def thread_budget(local_workers: int, environ: Mapping[str, str] | None = None) -> ThreadBudget:
    """Threads per worker for ``local_workers`` processes on this node; a user's value wins.

    The arithmetic is the runtime's (:func:`scaletrain.runtime.threads.choose_threads`): the
    cores this launcher was given (``SLURM_CPUS_PER_TASK``, else its affinity mask) shared by
    the workers, at least 1 each. The launcher differs only in leaving any ``OMP_NUM_THREADS``
    the user set untouched, even one torch would ignore.
    """
    env = os.environ if environ is None else environ
    user = env.get("OMP_NUM_THREADS", "").strip()
    if user:
        count = int(user) if user.isascii() and user.isdigit() and len(user) <= 6 else 0
        if count >= 1:
            return ThreadBudget(per_worker=count, source=f"OMP_NUM_THREADS={user} (set by you)", user_set=True)
        # 1e400, 0, "auto": left as set, and said to be what it is, not counted as some number of threads
        return ThreadBudget(per_worker=0, source=f"OMP_NUM_THREADS={user[:20]!r} set by you is not a thread "
                                                 "count: OpenMP ignores it", user_set=True)
    choice = choose_threads(environ=env, local_world_size=local_workers,
                            allowed_cpus=len(allowed_cpus()), per_slurm_task=local_workers)
    return ThreadBudget(per_worker=choice.threads, source=choice.source)
