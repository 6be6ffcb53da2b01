"""A batch script's srun program that sets its own rendezvous runs under `scaletrain run
--emulate` as under srun: the launcher's own rendezvous never takes the program's MASTER_PORT.

The program is the centre guides' form: the script exports MASTER_ADDR, MASTER_PORT and
WORLD_SIZE, and each task passes SLURM_PROCID (or Open MPI's rank) to init_process_group.
"""

from __future__ import annotations

import json

import pytest

from helpers import free_port
from workers import run_workers

pytestmark = pytest.mark.multiproc

# Seven lines: DDP over a linear layer, every rank's batch scaled by rank + 1, so the ranks
# agree only when the gradients were averaged over the whole world.
PROGRAM = """\
import json, os, sys, torch, torch.distributed as dist
rank, world = int(os.environ[sys.argv[1]]), int(os.environ.get("WORLD_SIZE") or os.environ[sys.argv[2]])
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0); model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3): opt.zero_grad(); model(torch.randn(4, 3) * (rank + 1)).sum().backward(); opt.step()
seen = [None] * world; dist.all_gather_object(seen, [[v for p in model.parameters() for v in p.reshape(-1).tolist()], os.environ.get("MASTER_PORT")])
_ = rank or open(sys.argv[3], "w").write(json.dumps(seen)); dist.destroy_process_group()
"""
RANK_VARS = {"slurm": ("SLURM_PROCID", "SLURM_NTASKS"),
             "mpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")}


def _expected(world: int) -> list[float]:
    """The parameters one process gets with the gradient averaged over ``world`` ranks whose
    batches are the same draw scaled by 1..world (the program's rank + 1)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scale = (world + 1) / 2  # the mean of 1..world
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 3) * scale).sum().backward()
        opt.step()
    return [v for p in model.parameters() for v in p.detach().reshape(-1).tolist()]


@pytest.mark.parametrize("mode,tasks,nodes,exported", [
    ("slurm", 2, 1, True), ("slurm", 2, 2, True), ("slurm", 4, 2, True), ("mpi", 4, 1, True),
    ("slurm", 4, 2, False)],
    ids=["slurm-2x1", "slurm-2-on-2-nodes", "slurm-4-on-2-nodes", "mpi-4x1", "slurm-unexported"])
def test_program_with_its_own_rendezvous_trains_under_emulation(tmp_path, mode, tasks, nodes,
                                                                  exported):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    out = tmp_path / "seen.json"
    port = free_port()
    env = ({"WORLD_SIZE": str(tasks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
           if exported else None)
    proc = run_workers(prog, nproc=tasks // nodes, args=[*RANK_VARS[mode], out], env=env,
                       launcher_args=["--emulate", mode, "--nnodes", str(nodes)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "EADDRINUSE" not in proc.stderr
    seen = json.loads(out.read_text())
    assert len(seen) == tasks
    ports = {s[1] for s in seen}
    assert len(ports) == 1
    if exported:
        assert ports == {str(port)}  # the program's port, as the batch script exported it
    params = [s[0] for s in seen]
    assert all(p == params[0] for p in params)
    assert params[0] == pytest.approx(_expected(tasks), rel=1e-5, abs=1e-6)
    assert params[0] != pytest.approx(_expected(1), rel=1e-5, abs=1e-6)


# The Princeton guide's form on a GPU job: GPUs per node from Slurm, the local rank from them.
GPU_PROGRAM = """\
import json, os, sys, torch, torch.distributed as dist
rank, world, gpus_per_node = int(os.environ["SLURM_PROCID"]), int(os.environ["WORLD_SIZE"]), int(os.environ["SLURM_GPUS_ON_NODE"])
assert gpus_per_node == torch.cuda.device_count() and int(os.environ["SLURM_CPUS_PER_TASK"]) >= 1
local_rank = rank - gpus_per_node * (rank // gpus_per_node); torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", rank=rank, world_size=world)
t = torch.tensor([float(rank + 1)], device=f"cuda:{local_rank}"); dist.all_reduce(t)
seen = [None] * world; dist.all_gather_object(seen, [t.item(), local_rank, os.environ["SLURM_GPUS_PER_NODE"]]); _ = rank or open(sys.argv[1], "w").write(json.dumps(seen))
"""


def test_gpu_job_variables_under_cpu_emulation(tmp_path):
    """--emulate slurm --cpu fakes a GPU per task: srun's GPU variables say so (29.10)."""
    prog = tmp_path / "gpu.py"
    prog.write_text(GPU_PROGRAM)
    out = tmp_path / "seen.json"
    env = {"WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = run_workers(prog, nproc=2, args=[out], env=env,
                       launcher_args=["--emulate", "slurm", "--cpu", "--nnodes", "2"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(out.read_text()) == [[10.0, r % 2, "2"] for r in range(4)]
