"""Worker for tests/multiproc/test_runtime_multiproc.py: many runtime checks, one launch.

Usage: python runtime_worker.py OUT_DIR. Writes OUT_DIR/rank<N>.json; prints marker lines
through scaletrain.print so the test can check which ranks printed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import scaletrain
from scaletrain.runtime.init import current

out = Path(sys.argv[1])
before = scaletrain.detect()  # no side effects: nothing initialised yet
import torch  # noqa: E402  (after detect, to show detect needs no torch)
import torch.distributed as dist  # noqa: E402

record: dict = {"group_before_init": dist.is_initialized()}
env = scaletrain.init()
record["env"] = {k: getattr(env, k) for k in (
    "rank", "local_rank", "world_size", "local_world_size", "node_rank", "num_nodes",
    "master_addr", "master_port", "device", "backend", "launcher", "job_id")}
record["extra"] = dict(env.extra)
record["detect_matches"] = (before.rank, before.world_size, before.local_rank,
                            before.master_port) == (env.rank, env.world_size, env.local_rank,
                                                    env.master_port)
record["idempotent"] = scaletrain.init() is env
record["dist_rank_world"] = [dist.get_rank(), dist.get_world_size()]

# all_reduce: sum of (rank + 1) and of a rank-dependent vector
t = torch.tensor([float(env.rank + 1)])
dist.all_reduce(t)
v = torch.arange(4, dtype=torch.float64) * (env.rank + 1)
dist.all_reduce(v)
record["sum"] = t.item()
record["vector"] = v.tolist()
record["affinity"] = sorted(os.sched_getaffinity(0))
record["threads"] = torch.get_num_threads()

scaletrain.print(f"MARK-DEFAULT from {env.rank}")
scaletrain.print(f"MARK-ALL from {env.rank}", ranks="all")
scaletrain.print(f"MARK-ONE from {env.rank}", ranks=[1])

# main_first: rank 0's block must finish before any other rank's block starts
flag = out / "main_first.flag"
with scaletrain.main_first():
    record["flag_seen_on_entry"] = flag.exists()
    if env.is_main:
        time.sleep(0.5)  # give a wrongly-unblocked rank time to get in first
        flag.write_text("done")
scaletrain.barrier()

scaletrain.shutdown()
record["group_after_shutdown"] = dist.is_initialized()
record["current_after_shutdown"] = current() is None
(out / f"rank{env.rank}.json").write_text(json.dumps(record))
