"""Stop signals in real 2-rank runs through `scaletrain run` (tier 2).

Four launches of tests/multiproc/preempt_worker.py (a tiny DDP loop polling StopAgreement):
- USR1 that each rank sends itself at a different step -> both stop at the same step;
- SIGTERM to one rank, USR1 to the other later -> the same step, reason "preempted";
- USR1, then SIGTERM, sent to the `scaletrain run` process itself -> it forwards them, the
  workers stop at one step and `scaletrain run` exits with EXIT_STOPPED (torch's agent would
  have killed them at SIGTERM and ignored USR1).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from workers import REPO, launcher_cmd, run_workers, worker_env

from scaletrain.contract.environ import EXIT_STOPPED

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("preempt_worker.py")


def _ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _check_same_stop(out: Path, reason: str, step: int | None = None) -> list[dict]:
    ranks = _ranks(out)
    steps = {r["stopped_at"] for r in ranks}
    assert len(steps) == 1, ranks            # every rank stopped at the same step
    if step is not None:
        assert steps == {step}, ranks
    assert {r["reason"] for r in ranks} == {reason}
    assert [r["seen"] for r in ranks][0] == [r["seen"] for r in ranks][1]  # same answers
    record = json.loads((out / "stop.json").read_text())
    assert record["reason"] == reason and record["step"] in steps
    assert record["rank_count"] == 2
    return ranks


def test_self_signals_at_different_steps_stop_together(tmp_path):
    # rank 0 is signalled after step 3, rank 1 after step 5: the agreement started at step 3
    # is read at step 4 on both ranks. Flag bits 0 and 1 from different ranks are OR-ed.
    proc = run_workers(WORKER, 2, [tmp_path, "--kill", "0:3:USR1", "--kill", "1:5:USR1",
                                   "--flags", "0:1:1", "--flags", "1:1:2"])
    assert proc.returncode == EXIT_STOPPED, proc.stdout + proc.stderr
    ranks = _check_same_stop(tmp_path, "time_limit", step=4)
    assert ranks[0]["seen"][1] == [2, None, 3]
    assert ranks[0]["signalled_at"] == 3 and "signalled_at" not in ranks[1]
    assert [r["signal"] for r in ranks] == ["SIGUSR1", ""]  # rank 1 stopped by agreement
    assert json.loads((tmp_path / "stop.json").read_text())["signal"] == "SIGUSR1"
    assert "time limit near (SIGUSR1): state saved at step 4" in proc.stderr
    assert "stopped on purpose" in proc.stderr


def test_sigterm_on_one_rank_is_a_preemption_for_all(tmp_path):
    proc = run_workers(WORKER, 2, [tmp_path, "--kill", "1:3:TERM", "--kill", "0:6:USR1"])
    assert proc.returncode == EXIT_STOPPED, proc.stdout + proc.stderr
    ranks = _check_same_stop(tmp_path, "preempted", step=4)
    assert ranks[1]["signalled_at"] == 3 and "signalled_at" not in ranks[0]
    assert json.loads((tmp_path / "stop.json").read_text())["signal"] == "SIGTERM"
    assert "job preempted (SIGTERM)" in proc.stderr


def _signal_launcher(tmp_path: Path, signum: int) -> tuple[subprocess.CompletedProcess, int]:
    # the default sync period (0.5 s): the interval adapts to ~25 steps of 20 ms
    cmd = [*launcher_cmd(2), str(WORKER), str(tmp_path), "--steps", "100000", "--sleep", "0.02",
           "--period", "0.5"]
    proc = subprocess.Popen(cmd, env=worker_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not all((tmp_path / f"ready.{r}").exists() for r in range(2)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "workers never reached step 2"
            time.sleep(0.1)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), proc.returncode


def test_usr1_to_scaletrain_run_reaches_the_workers(tmp_path):
    proc, code = _signal_launcher(tmp_path, signal.SIGUSR1)
    assert code == EXIT_STOPPED, proc.stdout + proc.stderr
    ranks = _check_same_stop(tmp_path, "time_limit")
    assert [r["signal"] for r in ranks] == ["SIGUSR1"] * 2  # each worker got it forwarded
    assert "received SIGUSR1; passing it to the workers" in proc.stderr


def test_sigterm_to_scaletrain_run_lets_the_workers_save(tmp_path):
    proc, code = _signal_launcher(tmp_path, signal.SIGTERM)
    assert code == EXIT_STOPPED, proc.stdout + proc.stderr
    ranks = _check_same_stop(tmp_path, "preempted")
    assert [r["signal"] for r in ranks] == ["SIGTERM"] * 2
    assert "received SIGTERM; passing it to the workers" in proc.stderr
