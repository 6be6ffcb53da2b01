"""A worker job where rank 1 raises while rank 0 sleeps; plain torch, no scaletrain import.

Usage: launch_fail_worker.py OUT_DIR MODE
  MODE=raise  : rank 1 raises ValueError after both ranks wrote their PID; rank 0 sleeps 300 s
                (so only the launcher can stop it).
  MODE=flaky  : every rank exits 3 on the first attempt, succeeds on the restart.
  MODE=sleep  : every rank sleeps 300 s (the test signals the launcher).
  MODE=abort  : rank 1 aborts in native code (os.abort, as heap corruption does) inside
                die_natively(); rank 0 sleeps 300 s.
"""

import os
import sys
import time

import torch.distributed as dist

out_dir, mode = sys.argv[1], sys.argv[2]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank = dist.get_rank()
with open(os.path.join(out_dir, f"pid{rank}.attempt{attempt}"), "w") as fh:
    fh.write(str(os.getpid()))
dist.barrier()  # every PID is on disk before anything fails

if mode == "raise":
    if rank == 1:
        print("rank 1 is about to fail", file=sys.stderr, flush=True)
        raise ValueError("boom-from-rank-1")
    time.sleep(300)
elif mode == "abort":
    def die_natively():
        os.abort()

    if rank == 1:
        die_natively()
    time.sleep(300)
elif mode == "sleep":
    time.sleep(300)
elif mode == "flaky":
    if attempt == 0:
        sys.exit(3)
    print(f"attempt {attempt} ok", flush=True)
dist.destroy_process_group()
