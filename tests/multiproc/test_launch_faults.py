"""`scaletrain run` against failures inside a job: a rank that never arrives at a collective,
a ScaletrainError raised in a worker, worker exit codes, and `kill -9` of the launcher.

Each launch is bounded by a subprocess timeout far below the 600 s the stuck rank sleeps, so
a launcher that waited for it would fail the test (no timed assertion).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import alive as _alive
from workers import launcher_cmd, worker_env

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("failures_worker.py")


def _reap(pids) -> list[int]:
    """Wait a little for ``pids`` to end; kill and return the survivors."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    survivors = [p for p in pids if _alive(p)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return survivors


def _pids(out: Path) -> list[int]:
    return [int(p.read_text()) for p in out.glob("pid*.attempt0")]


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    out = tmp_path_factory.mktemp("hang")
    run_dir = out / "run"
    proc = subprocess.run([*launcher_cmd(2, ["--timeout", "3", "--run-dir", str(run_dir)]),
                           str(WORKER), str(out), "hang"], env=worker_env(),
                          capture_output=True, text=True, timeout=240)
    return proc, run_dir, _pids(out)


def test_hang_ends_with_the_rank_that_did_not_arrive(hung):
    proc, _, pids = hung
    assert proc.returncode == 1, proc.stdout + proc.stderr
    error = proc.stderr.split("scaletrain: error: ", 1)[1]
    first = error.splitlines()[0]
    assert first.startswith("rank 1 did not reach the collective within 3 s"), first
    assert f"rank 1 (host {os.uname().nodename})" in first
    assert "failures_worker.py:" in first            # where rank 1 is stuck
    assert "rank 0 waited in all_reduce" in first
    assert not _reap(pids)


def test_hang_leaves_every_ranks_stack(hung):
    _, run_dir, _ = hung
    stacks = {p.name: p.read_text() for p in (run_dir / "stacks").glob("rank-*.txt")}
    assert sorted(stacks) == ["rank-0.txt", "rank-1.txt"]
    assert "in <module>" in stacks["rank-1.txt"] and "failures_worker.py" in stacks["rank-1.txt"]
    assert "Timed out" in stacks["rank-0.txt"]       # rank 0's own view: where it waited
    assert str(run_dir / "stacks") in hung[0].stderr  # the message says where they are


def test_a_rank_that_aborts_at_its_timeout_is_diagnosed_by_the_launcher(tmp_path):
    # NCCL's watchdog kills a timed-out rank (SIGABRT) before Python sees an exception
    run_dir = tmp_path / "run"
    proc = subprocess.run([*launcher_cmd(2, ["--timeout", "3", "--run-dir", str(run_dir)]),
                           str(WORKER), str(tmp_path), "hang_abort"], env=worker_env(),
                          capture_output=True, text=True, timeout=240)
    assert not _reap(_pids(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = proc.stderr.split("scaletrain: error: ", 1)[1].splitlines()[0]
    assert first.startswith("rank 1 did not reach the collective: rank 1 (host"), first
    assert "rank 0 timed out waiting in a collective and aborted" in first
    assert "failures_worker.py" in (run_dir / "stacks" / "rank-1.txt").read_text()
    assert "Fatal Python error: Aborted" in (run_dir / "stacks" / "rank-0.txt").read_text()


def test_scaletrain_error_in_a_worker_is_one_line_with_its_exit_code(tmp_path):
    proc = subprocess.run([*launcher_cmd(2), str(WORKER), str(tmp_path), "env_error"],
                          env=worker_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3, proc.stdout + proc.stderr  # DistEnvError's code
    assert "scaletrain: error: SCALETRAIN_PROCS_PER_GPU='two' is not a positive integer" in proc.stderr
    assert "\n  HINT: unset it" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "failures_worker.py:" in proc.stderr  # the user's line that called init()


def test_an_abort_after_the_program_finished_is_named_with_the_workaround(tmp_path):
    # torch aborts a process whose gloo thread is still releasing work at interpreter exit;
    # the training had completed: the message says so, and how to end the program instead
    proc = subprocess.run([*launcher_cmd(2), str(WORKER), str(tmp_path), "abort_at_exit"],
                          env=worker_env(), capture_output=True, text=True, timeout=180)
    assert not _reap(_pids(tmp_path))
    assert proc.returncode == 128 + signal.SIGABRT, proc.stdout + proc.stderr
    error = proc.stderr.split("scaletrain: error: ", 1)[1].splitlines()
    assert error[0].startswith("rank 1 (local rank 1, pid ") and \
        "finished its program, then aborted while Python shut down (was killed by SIGABRT" in error[0]
    assert error[1].startswith("  HINT: the training itself completed") and \
        "torch.distributed.destroy_process_group()" in error[1], error


@pytest.mark.parametrize("code,want", [(3, 1), (75, 75)])
def test_worker_exit_codes_map_without_collisions(tmp_path, code, want):
    # 3 is scaletrain's own "environment" code: a worker's 3 must not look like one (-> 1).
    # 75 (stopped on purpose after saving) passes through, and is not restarted.
    proc = subprocess.run([*launcher_cmd(2, ["--max-restarts", "1"]), str(WORKER), str(tmp_path),
                           "exit", str(code)], env=worker_env(), capture_output=True, text=True,
                          timeout=240)
    pids = _pids(tmp_path) + [int(p.read_text()) for p in tmp_path.glob("pid*.attempt1")]
    assert not _reap(pids)
    assert proc.returncode == want, proc.stdout + proc.stderr
    if code == 75:
        assert "not restarting" in proc.stderr
        assert not list(tmp_path.glob("pid*.attempt1"))
    else:
        assert f"rank 1 (local rank 1, pid" in proc.stderr and f"exited with code {code}" in proc.stderr
        assert "restarting all workers" in proc.stderr


def test_kill_9_of_the_launcher_takes_the_workers_along(tmp_path):
    proc = subprocess.Popen([*launcher_cmd(2), str(WORKER), str(tmp_path), "sleep"],
                            env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(_pids(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = _pids(tmp_path)
        assert len(pids) == 2, "workers did not start"
    finally:
        proc.kill()
        proc.wait()
    assert not _reap(pids), "workers outlived a SIGKILLed launcher"
