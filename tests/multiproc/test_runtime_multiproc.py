"""scaletrain.init() in real processes (tier 2): an emulated srun, and `scaletrain run`.

Two launches for the module, each of 2 processes running tests/multiproc/runtime_worker.py:
- ``srun``: started here with subprocess.Popen and the variables srun gives its tasks
  (SLURM_PROCID/LOCALID/NTASKS/NODEID/JOB_ID/STEP_ID/JOB_NODELIST/TASKS_PER_NODE...), so the
  Slurm detector, the job-id port and the first-host address are what rendezvous;
- ``run``: through tests/workers.py run_workers (`scaletrain run`, torchrun's contract).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from workers import REPO, run_workers, worker_env

from scaletrain.contract.environ import port_from_job_id

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("runtime_worker.py")
NPROC = 2


def _free_job_id() -> str:
    """A fake job id whose derived port is free right now (ports are 10000-29999)."""
    for job in range(31337, 31337 + 20000, 97):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port_from_job_id(str(job))))
            except OSError:
                continue
            return str(job)
    raise RuntimeError("no free port in the job-id range")


def _records(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(NPROC)
            if (out / f"rank{r}.json").exists()]


@pytest.fixture(scope="module")
def srun(tmp_path_factory):
    out = tmp_path_factory.mktemp("runtime_srun")
    job = _free_job_id()
    procs = []
    for rank in range(NPROC):
        env = worker_env({
            "SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
            "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
            "SLURM_NTASKS": str(NPROC), "SLURM_NPROCS": str(NPROC), "SLURM_JOB_NUM_NODES": "1",
            "SLURM_NNODES": "1", "SLURM_TASKS_PER_NODE": str(NPROC),
            "SLURM_STEP_NUM_TASKS": str(NPROC), "SLURM_STEP_TASKS_PER_NODE": str(NPROC),
            "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_NODELIST": "localhost",
            "SLURM_CPUS_PER_TASK": "1", "SCALETRAIN_DEVICE": "cpu"})
        env.pop("OMP_NUM_THREADS", None)  # threads must come from SLURM_CPUS_PER_TASK
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, cwd=REPO))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=150)[0])
    finally:
        for p in procs:  # never leave a worker behind, whatever happened
            if p.poll() is None:
                p.kill()
                p.wait()
    return job, [p.returncode for p in procs], outputs, _records(out)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runtime_run")
    proc = run_workers(WORKER, NPROC, [str(out)], env={"SCALETRAIN_DEVICE": "cpu"},
                       timeout=150)
    return proc, _records(out)


def test_srun_tasks_exit_cleanly(srun):
    _, codes, outputs, records = srun
    assert codes == [0] * NPROC, "\n".join(outputs)
    assert len(records) == NPROC


def test_srun_env_is_right(srun):
    job, _, _, records = srun
    for rank, rec in enumerate(records):
        assert rec["env"] == {
            "rank": rank, "local_rank": rank, "world_size": NPROC, "local_world_size": NPROC,
            "node_rank": 0, "num_nodes": 1, "master_addr": "localhost",
            "master_port": port_from_job_id(job), "device": "cpu", "backend": "gloo",
            "launcher": "slurm", "job_id": job}
        assert rec["detect_matches"] and rec["idempotent"]
        assert rec["dist_rank_world"] == [rank, NPROC]
        assert rec["extra"]["threads_from"] == "SLURM_CPUS_PER_TASK=1" and rec["threads"] == 1


def test_srun_all_reduce_sums(srun):
    records = srun[3]
    for rec in records:
        assert rec["sum"] == sum(range(1, NPROC + 1))  # 1 + 2
        assert rec["vector"] == [i * sum(range(1, NPROC + 1)) for i in range(4)]


def test_srun_ranks_bound_to_disjoint_cores(srun):
    records = srun[3]
    bound = [set(r["affinity"]) for r in records]
    if all("cpu_bind" in r["extra"] for r in records):
        assert not bound[0] & bound[1]
    else:  # fewer cores than ranks: nothing to split, each keeps the whole set
        assert bound[0] == bound[1]


def test_srun_print_and_main_first(srun):
    _, _, outputs, records = srun
    assert "MARK-DEFAULT from 0" in outputs[0]
    assert "MARK-DEFAULT" not in outputs[1]
    assert "[rank 0] MARK-ALL from 0" in outputs[0] and "[rank 1] MARK-ALL from 1" in outputs[1]
    assert "MARK-ONE from 1" in outputs[1] and "MARK-ONE" not in outputs[0]
    assert records[0]["flag_seen_on_entry"] is False
    assert records[1]["flag_seen_on_entry"] is True  # rank 0 finished before rank 1 entered


def test_srun_shutdown_leaves_no_group(srun):
    for rec in srun[3]:
        assert rec["group_before_init"] is False
        assert rec["group_after_shutdown"] is False and rec["current_after_shutdown"]


def test_scaletrain_run_gives_torchrun_env(run):
    proc, records = run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(records) == NPROC
    ports = {r["env"]["master_port"] for r in records}
    assert len(ports) == 1
    for rank, rec in enumerate(records):
        env = rec["env"]
        assert (env["rank"], env["local_rank"], env["world_size"], env["launcher"]) == \
            (rank, rank, NPROC, "torchrun")
        assert rec["sum"] == 3.0 and rec["idempotent"] and rec["detect_matches"]
        assert rec["group_after_shutdown"] is False
    assert records[1]["flag_seen_on_entry"] is True
    assert proc.stdout.count("MARK-DEFAULT") == 1
