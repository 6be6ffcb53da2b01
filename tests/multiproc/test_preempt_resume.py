"""Exact resume after a stop by signal (tier 2): 2N steps straight == N steps, a signal, and a
resumed run - parameters and optimizer state bitwise equal on CPU, for ddp, zero1 and zero3.

Two launches of tests/multiproc/resume_worker.py per strategy: ``stop`` (rank 0 signals itself
after step 4; the agreement stops both ranks at step 5, in the middle of the first 6-step epoch;
`scaletrain run` exits with EXIT_STOPPED), then ``resume`` (continues from step 5 to 10 and
compares, in the same process, with a fresh run of 10 steps).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from workers import run_workers

from scaletrain.contract.environ import EXIT_STOPPED

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("resume_worker.py")


@pytest.mark.parametrize("strategy, sig", [("ddp", "USR1"), ("zero1", "TERM"), ("zero3", "USR1")])
def test_resume_after_a_signal_is_bitwise_exact(tmp_path, strategy, sig):
    stop = run_workers(WORKER, 2, [tmp_path, strategy, "stop", "--signal-at", "4", "--sig", sig],
                       timeout=300)
    assert stop.returncode == EXIT_STOPPED, stop.stdout + stop.stderr
    record = json.loads((tmp_path / "checkpoints" / "stop.json").read_text())
    reason = "time_limit" if sig == "USR1" else "preempted"
    assert (record["reason"], record["step"], record["signal"]) == (reason, 5, "SIG" + sig)
    assert (tmp_path / "checkpoints" / "step-00000005" / "COMMIT.json").is_file()

    resume = run_workers(WORKER, 2, [tmp_path, strategy, "resume"], timeout=300)
    assert resume.returncode == 0, resume.stdout + resume.stderr
    for rank in range(2):
        result = json.loads((tmp_path / f"result-rank{rank}.json").read_text())
        assert (result["start"], result["end"]) == (5, 10)
        assert result["same_keys"] and any(k.startswith("opt") for k in result["keys"])
        assert result["moved"], "training did not change the parameters: the check is void"
        assert result["unequal"] == [], result
