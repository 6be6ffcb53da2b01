"""A plain torchrun-style worker: NO scaletrain import. Records what the launcher gave it.

Usage: launch_contract_worker.py OUT_DIR [ARGS...]; writes OUT_DIR/rank<R>.json.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS", "SCALETRAIN_BACKEND",
            "SCALETRAIN_PROCS_PER_GPU")

out_dir, passed = sys.argv[1], sys.argv[2:]
dist.init_process_group("gloo")  # env:// : exactly what a torchrun script does
rank, world = dist.get_rank(), dist.get_world_size()

total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)  # 1 + 2 + ... + world
vector = torch.arange(4, dtype=torch.float64) * (rank + 1)
dist.all_reduce(vector)  # [0, 1, 2, 3] * world*(world+1)/2
biggest = torch.tensor([rank * 10])
dist.all_reduce(biggest, op=dist.ReduceOp.MAX)

print(f"marker-out {rank}", flush=True)
print(f"marker-err {rank}", file=sys.stderr, flush=True)
record = {
    "env": {k: os.environ.get(k) for k in CONTRACT},
    "dist_rank": rank, "dist_world": world,
    "sum": total.item(), "vector": vector.tolist(), "max": biggest.item(),
    "threads": torch.get_num_threads(), "argv": passed, "pid": os.getpid(),
    # the worker entry (scaletrain.launch.worker, scaletrain.launch.inproc) is loaded; nothing of the runtime is
    "scaletrain_runtime_imported": any(m.startswith(("scaletrain.runtime", "scaletrain.parallel",
                                                     "scaletrain.data")) for m in sys.modules),
}
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
    json.dump(record, fh)
dist.destroy_process_group()
