"""Can this torch run a pipelining schedule over gloo? Asked of torch, once per process.

Over gloo (the CPU) torch's pipelining differs between releases in ways no attribute shows:
on 2.6.0 and 2.7.1 ``Schedule1F1B`` waits for ever in its first step (``ScheduleGPipe``
works), and on 2.9.1 every schedule's point-to-point exchange aborts the process inside gloo
("gloo::EnforceNotMet ... Received data size doesn't match expected size": a C++ abort, which
no ``try`` can catch). Neither can be tried inside the training processes, so rank 0 runs the
schedule once on a two-stage toy in two fresh processes of this interpreter, with a time
limit, and tells the other ranks what it saw. :func:`choose_schedule` then keeps the schedule,
falls back to GPipe with one line, or stops with one line naming torch and the schedule.
NCCL and other backends are not probed: the failures above are gloo's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from functools import lru_cache

from scaletrain.errors import StrategyError

# A toy step takes well under a second; the probe's two fresh interpreters took 13-22 s in all
# on a loaded 2-core machine (mostly importing torch). A hang is the only thing that reaches
# this, and it is paid once per process, where the probed schedule hangs (1F1B on 2.7.1).
PROBE_TIMEOUT_S = 60.0

# Two stages, 4 micro-batches, two steps, over gloo: what setup(strategy="pipeline") runs.
_PROGRAM = """
import sys, torch, torch.distributed as dist, torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining as pp
schedule, rank, address = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=address)
torch.manual_seed(0)
module = [nn.Sequential(nn.Linear(8, 16), nn.ReLU()), nn.Linear(16, 4)][rank]
stage = pp.PipelineStage(module, rank, 2, torch.device("cpu"))
cls = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B}[schedule]
run = cls(stage, n_microbatches=4, loss_fn=F.cross_entropy)
for _ in range(2):
    if rank == 0:
        run.step(torch.randn(8, 8))
    else:
        run.step(target=torch.randint(0, 4, (8,)), losses=[])
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@lru_cache(maxsize=None)
def probe_schedule(schedule: str) -> str | None:
    """None when two local processes of this interpreter ran ``schedule`` ("gpipe", "1f1b")
    over gloo; else what went wrong, in a few words (no process group needed)."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _PROGRAM, schedule, str(rank), address],
                              env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    errors: list[str] = []
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
            if proc.returncode != 0:
                errors += [line.strip() for line in err.splitlines() if line.strip()]
    except subprocess.TimeoutExpired:
        return f"waits for ever in its first step (no step within {PROBE_TIMEOUT_S:.0f} s)"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    if not errors:
        return None
    # gloo's own words where it aborted ("... Received data size doesn't match expected size")
    gloo = [line.split("] ", 1)[-1] for line in errors if "enforce fail" in line]
    return f"aborts in gloo ({(gloo or errors)[-1].split(' Is there')[0][:160]})"


def choose_schedule(schedule: str, backend: str) -> str:
    """The schedule to run instead of ``schedule`` over ``backend``: itself where it works,
    "gpipe" where only that works (one line on rank 0 says so). A collective over the world:
    every rank calls it at the same point of ``setup()``.

    Raises:
        StrategyError: no schedule runs over this backend on this torch (one line).
    """
    if backend != "gloo":
        return schedule
    import torch
    import torch.distributed as dist

    from scaletrain.runtime import collectives

    tried: dict[str, str | None] = {}
    if dist.get_rank() == 0:
        tried[schedule] = probe_schedule(schedule)
        if tried[schedule] is not None and schedule != "gpipe":
            tried["gpipe"] = probe_schedule("gpipe")  # the fallback, asked only when needed
    # ours, not broadcast_object_list: it returns only once gloo's threads let go of its
    # buffers, so a destroy_process_group() right after it cannot deadlock on them
    tried = collectives.broadcast_object(tried, src=0)
    if tried[schedule] is None:
        return schedule
    where = f"pipeline schedule {schedule!r} over gloo on torch {torch.__version__}"
    if "gpipe" in tried and tried["gpipe"] is None:
        if dist.get_rank() == 0:
            print(f"scaletrain: {where} {tried[schedule]} (probed); using 'gpipe' instead",
                  file=sys.stderr, flush=True)
        return "gpipe"
    also = ", and so does 'gpipe'" if schedule != "gpipe" else ""
    raise StrategyError(f"{where} {tried[schedule]}{also} (probed)",
                        hint="on the CPU use ddp or zero1 instead of the pipeline, or another "
                             "torch (docs/torch-support.md lists what each release runs)")
