"""Requeue end to end on the local 2-node Slurm cluster: a script from ``plan --requeue``.

- A 2-node job training with a Checkpointer (its first run trains until it is told to stop, so
  the test never races the workload), with the per-node agent (srun -> ``scaletrain run`` on each
  node -> a worker) and in the default mode (srun -> one task per rank), gets ``scancel --batch --signal=USR1`` (what ``--signal=B:USR1@grace`` does at
  the time limit): the batch shell relays it to srun, srun to each ``scaletrain run``, which
  forwards it to its worker (default mode: srun to each rank); both ranks save the same step and exit 75; the script requeues the
  job; the second run (SLURM_RESTART_COUNT=1) resumes and finishes with parameters and
  optimizer state equal to an uninterrupted run (computed in the same process).
- A job whose tasks stop (exit 75) at every start is requeued at most MAX_REQUEUES times.
- A job whose task fails is not requeued at all.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaletrain.contract.environ import EXIT_STOPPED
from scaletrain.plan.resources import MAX_REQUEUES

pytestmark = pytest.mark.slurm

HERE = Path(__file__).resolve().parent
JOB = HERE / "requeue_job.py"
EXIT_JOB = HERE / "exit_job.py"


def _submit(cluster, profile: Path, run_dir: Path, *args: str) -> str:
    proc = cluster.scaletrain("submit", "--profile", str(profile), "--run-dir", str(run_dir),
                              "--requeue", "--time", "00:10:00", "--device", "cpu", *args,
                              timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()[0].strip()


def _job(cluster, job_id: str) -> str:
    return cluster.run("scontrol", "show", "job", "-o", job_id).stdout


def _wait_final(cluster, job_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = _job(cluster, job_id)
        if re.search(r"JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)", text):
            return text
        time.sleep(1)
    cluster.run("scancel", job_id)
    pytest.fail(f"job {job_id} did not end within {timeout:g} s: {_job(cluster, job_id)}")


def _output(run_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("*.out")))


@pytest.mark.parametrize("launcher", ["scaletrain-run", "scaletrain"])
def test_usr1_checkpoints_requeues_and_resumes_exactly(slurm_cluster, probed_profile, tmp_path,
                                                       launcher):
    out = tmp_path / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    job_id = _submit(slurm_cluster, probed_profile, run_dir, "--nodes", "2", "--gpus-per-node", "1",
                     "--cpus-per-gpu", "1", "--launcher", launcher, "--", str(JOB), str(out), "20")
    try:
        deadline = time.monotonic() + 180
        while not (out / "ready.0").exists():
            assert time.monotonic() < deadline, _job(slurm_cluster, job_id) + _output(run_dir)
            # one reading per check: two scontrol calls raced the job's start (PENDING at the
            # first, RUNNING at the second: neither matched its own test)
            state = _job(slurm_cluster, job_id)
            assert re.search(r"JobState=(PENDING|CONFIGURING|RUNNING) ", state), state + _output(run_dir)
            time.sleep(0.5)
        sig = slurm_cluster.run("scancel", "--batch", "--signal=USR1", job_id)
        assert sig.returncode == 0, sig.stderr
        final = _wait_final(slurm_cluster, job_id, 400)
    finally:
        slurm_cluster.run("scancel", job_id)
    log = _output(run_dir)
    assert "JobState=COMPLETED" in final and "Restarts=1" in final, final + log
    stop = json.loads((out / "checkpoints" / "stop.json").read_text())
    assert stop["reason"] == "time_limit" and stop["signal"] == "SIGUSR1", stop
    assert stop["restart_count"] == 0 and stop["rank_count"] == 2
    assert sorted(p.name for p in out.glob("started.*")) == \
        ["started.0.0", "started.0.1", "started.1.0", "started.1.1"]
    assert "got SIGUSR1" in log and "requeueing job" in log, log
    for rank in range(2):
        result = json.loads((out / f"result.{rank}.json").read_text())
        assert result["restart"] == "1" and result["start"] == stop["step"], result
        assert result["start"] >= 3 and result["tensors"] >= 4
        assert result["equal"], (result, log)


def test_requeue_is_bounded(slurm_cluster, probed_profile, tmp_path):
    # tasks that stop on purpose at every start: requeued MAX_REQUEUES times, then the job ends
    run_dir = tmp_path / "run"
    job_id = _submit(slurm_cluster, probed_profile, run_dir, "--gpus", "1", "--",
                     str(EXIT_JOB), str(EXIT_STOPPED))
    try:
        final = _wait_final(slurm_cluster, job_id, 60 + 30 * MAX_REQUEUES)
    finally:
        slurm_cluster.run("scancel", job_id)
    log = _output(run_dir)
    assert f"Restarts={MAX_REQUEUES}" in final, final + log
    assert "JobState=FAILED" in final and f"ExitCode={EXIT_STOPPED}:0" in final, final
    assert log.count("requeueing job") == MAX_REQUEUES, log   # --open-mode=append keeps them
    assert f"requeued {MAX_REQUEUES} times already" in log


def test_failed_tasks_are_not_requeued(slurm_cluster, probed_profile, tmp_path):
    run_dir = tmp_path / "run"
    job_id = _submit(slurm_cluster, probed_profile, run_dir, "--gpus", "1", "--", str(EXIT_JOB), "3")
    try:
        final = _wait_final(slurm_cluster, job_id, 90)
    finally:
        slurm_cluster.run("scancel", job_id)
    assert "JobState=FAILED" in final and "Restarts=0" in final and "ExitCode=3:0" in final, final
    assert "requeueing" not in _output(run_dir)
