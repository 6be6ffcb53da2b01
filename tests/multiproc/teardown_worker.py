"""A program shaped like the corpus one that hung in torch's gloo teardown: DDP over gloo, a
few steps, ``destroy_process_group()`` at the end; then rank 0's exit does not end, in one of
these ways (rank 1 always exits):

- ``clean``: it exits;
- ``stuck``: it blocks inside torch (a store barrier no one else joins), as a rank deadlocked
  in its teardown does;
- ``sleeper``: a non-daemon thread it started sleeps for ever, so the interpreter's exit waits;
- ``deadlock``: its main thread takes a lock it holds, in the program's own frames (the shape
  of gloo's teardown deadlock as a faulthandler dump shows it: no CPU, the program's line);
- ``working``: a non-daemon thread ("uploader") still works when the launcher looks (it works
  until the launcher asked for its stack), then writes OUT_DIR/uploaded;
- ``child``: a non-daemon thread waits for a child process that works the same way;
- ``pause``: rank 1 waits 6 s without using CPU in the middle of training (rank 0 waits for it
  in a collective), longer than the launcher's wait: training, not a teardown.

Usage: teardown_worker.py OUT_DIR MODE
"""

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

out, mode = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(rank)
for step in range(5):
    if mode == "pause" and rank == 1 and step == 2:
        time.sleep(6)
    loss = model(torch.randn(4, 8, generator=generator)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
params = [p.detach().flatten().tolist() for p in model.parameters()]
with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
    json.dump(params, fh)
dist.destroy_process_group()
# the launcher asks a worker for its stack by signal; the dump lands here (launch/rundir.py)
ASKED = Path(os.environ["SCALETRAIN_RUN_DIR"], "stacks", f"rank-{rank}.txt")
WORK_UNTIL_ASKED = ("from pathlib import Path; import sys\n"
                    "while not Path(sys.argv[1]).stat().st_size: sum(range(10000))\n")


def upload() -> None:
    while not ASKED.stat().st_size:   # works (uses CPU) until the launcher has looked
        sum(range(10000))
    Path(out, "uploaded").write_text("whole")


def upload_in_a_child() -> None:
    subprocess.run([sys.executable, "-c", WORK_UNTIL_ASKED, str(ASKED)], check=True)
    Path(out, "uploaded").write_text("whole")


if rank == 0 and mode == "stuck":
    from torch.distributed.elastic.utils.store import barrier

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(hours=1))
    barrier(store, world_size=2, key_prefix="never", barrier_timeout=3600)
elif rank == 0 and mode == "sleeper":
    threading.Thread(target=time.sleep, args=(3600,), name="sleeper").start()
elif rank == 0 and mode == "deadlock":
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
elif rank == 0 and mode == "working":
    threading.Thread(target=upload, name="uploader").start()
elif rank == 0 and mode == "child":
    threading.Thread(target=upload_in_a_child, name="uploader").start()
