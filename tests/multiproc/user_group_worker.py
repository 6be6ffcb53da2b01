"""Worker for tests/multiproc/test_user_group.py: every consumer of "who am I" under a group
the program made itself with ``dist.init_process_group`` (no ``scaletrain.init()``).

``--swap-port P``: the group numbers the ranks in reverse of the launcher's RANK (a rendezvous
of its own on port P), so a consumer that reads the launcher's variables instead of the group
is caught. Each process writes ``rank<group rank>.json`` in OUT; all share ``OUT/monitor``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

import scaletrain
from scaletrain.checkpoint.comm import Comm
from scaletrain.checkpoint.stoprecord import write_stop_record
from scaletrain.fileio import atomic_write
from scaletrain.runtime import preempt
from scaletrain.runtime.agreement import StopAgreement
from scaletrain.runtime.current import collective_device, current_env, error_rank

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--swap-port", type=int, default=0)
args = p.parse_args()
out = Path(args.out)

launcher_rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if args.swap_port:
    # a rendezvous of our own: this process hosts its store when it is the group's rank 0 (the
    # launcher's agent store, which torch would otherwise join as a client, is on another port)
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.swap_port}",
                            rank=world - 1 - launcher_rank, world_size=world)
else:
    dist.init_process_group("gloo")
rank = dist.get_rank()
rec: dict = {"launcher_rank": launcher_rank, "group_rank": rank}

env = current_env()
rec["env"] = [env.rank, env.world_size, env.device, env.backend]
rec["collective_device"] = collective_device()
rec["error_rank"] = error_rank()  # what an error escaping this rank would be labelled with

ld = scaletrain.loader(TensorDataset(torch.arange(8)), batch_size=1, shuffle=False, num_workers=0,
                       base_world_size=None)
rec["loader"] = [int(b[0]) for b in ld]

scaletrain.print(f"PRINT-DEFAULT from group rank {rank}")
scaletrain.barrier()
with scaletrain.main_first():  # the group's rank 0 first: only it writes the flag
    rec["main_first_saw_flag"] = (out / "first.flag").exists()
    if rank == 0:
        (out / "first.flag").write_text("rank 0 went first\n")
rec["mean"] = scaletrain.all_reduce_mean(float(rank))
rec["gathered"] = scaletrain.gather_objects(rank)

comm = Comm()
rec["comm"] = [comm.rank, comm.world_size, comm.gather(rank)]
comm.close()

# the Checkpointer and export: the group's rank 0 writes, every rank loads the same step
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
ckpt = scaletrain.Checkpointer(out / "ckpt")
ckpt.save(7, {"model": model})
fresh = torch.nn.Linear(3, 2)
loaded = ckpt.load_latest({"model": fresh})
exported = ckpt.export(out / "model.pt", model)
ckpt.close()
rec["checkpoint"] = [loaded, torch.equal(fresh.weight, model.weight), exported is not None]

agreement = StopAgreement(period_s=0)
if rank == 1:
    preempt.request("requested")
seen = None
for _ in range(3):
    reason, _flags = agreement.poll()
    seen = seen or reason
agreement.close()
rec["agreed"] = seen
if rank == 0:
    stop = json.loads(write_stop_record(out / "stop", reason="requested", step=1, log=False).read_text())
    rec["stop_rank_count"] = stop["rank_count"]

monitor = scaletrain.Monitor(out / "monitor", console=False, device_sampler=None)
for _ in range(5):
    monitor.step(samples=4, loss=1.0)
summary = monitor.close()
rec["monitor"] = [monitor.rank, monitor.world_size, summary["world_size"]]

atomic_write(out / f"rank{rank}.json", json.dumps(rec))
dist.barrier()
dist.destroy_process_group()
