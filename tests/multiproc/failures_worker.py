"""Workers that fail in the ways `scaletrain run` must report well (tests/multiproc/test_launch_faults.py).

Usage: failures_worker.py OUT_DIR MODE [ARG]
  hang       : one step, then rank 1 sleeps 600 s before the next all_reduce (never arrives)
  hang_abort : the same, but rank 0 aborts at its timeout (as NCCL's watchdog does), so only
               the launcher can tell who did not arrive
  env_error  : scaletrain.init() meets a contradictory SCALETRAIN_PROCS_PER_GPU (DistEnvError)
  exit CODE  : rank 1 exits with CODE after both ranks wrote their PID; rank 0 sleeps
  sleep      : both ranks write their PID and sleep 600 s (the test kills the launcher)
  abort_at_exit : both ranks finish; rank 1 then aborts while Python shuts down, as a gloo
               thread still releasing work at exit makes torch do (SIGABRT from an atexit handler)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

out, mode = Path(sys.argv[1]), sys.argv[2]

import scaletrain  # noqa: E402

if mode == "env_error":
    os.environ["SCALETRAIN_PROCS_PER_GPU"] = "two"
env = scaletrain.init()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
(out / f"pid{env.rank}.attempt{attempt}").write_text(str(os.getpid()))
t = torch.ones(2)
dist.all_reduce(t)  # every PID is on disk before anything fails

if mode in ("hang", "hang_abort"):
    scaletrain.training_started()  # a step ran: the short --timeout applies from here
    if env.rank == 1:
        time.sleep(600)
    try:
        dist.all_reduce(t)
    except RuntimeError as exc:
        if mode == "hang_abort":
            print(f"watchdog: {exc}", file=sys.stderr, flush=True)
            os.abort()
        raise
elif mode == "exit":
    if env.rank == 1:
        sys.exit(int(sys.argv[3]))
    time.sleep(600)
elif mode == "sleep":
    time.sleep(600)
elif mode == "abort_at_exit" and env.rank == 1:
    import atexit

    def _abort() -> None:
        print("terminate called without an active exception", file=sys.stderr, flush=True)
        os.abort()

    atexit.register(_abort)
