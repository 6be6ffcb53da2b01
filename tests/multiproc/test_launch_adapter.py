"""Real launches on a torch that renamed what the launcher patches (issue 37 item 1; the unit
tests in tests/unit/test_launch_adapter.py rename each name one by one): a behaviour patch
that cannot work stops the launch before any worker starts, with the reason and the way out;
the way out (SCALETRAIN_TORCH_AS_IS=1) runs torch's agent as it is and trains; a speed patch
that cannot work is switched off with one line and the run goes on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from workers import ALLREDUCE, worker_env

from scaletrain.contract.environ import TORCH_AS_IS_VAR

pytestmark = pytest.mark.multiproc

DRIVER = Path(__file__).with_name("adapter_driver.py")
PROGRAM = ALLREDUCE


def _launch(tmp_path: Path, restarts: int, extra: dict[str, str]) -> subprocess.CompletedProcess:
    program = tmp_path / "allreduce.py"
    program.write_text(PROGRAM)
    return subprocess.run([sys.executable, str(DRIVER), "--nproc-per-node", "2", "--max-restarts",
                           str(restarts), str(program)], env=worker_env(extra),
                          capture_output=True, text=True, timeout=300)


def test_a_renamed_restart_count_stops_the_launch_with_the_way_out(tmp_path):
    proc = _launch(tmp_path, 1, {})
    # before: every launch failed with "workers could not be started: AttributeError"
    assert proc.returncode == 1, proc.stderr
    assert "[rank" not in proc.stdout + proc.stderr  # no worker started
    assert "lacks torch.distributed.elastic.agent.server.api.SimpleElasticAgent." \
           "_remaining_restarts, which scaletrain's restart policy needs" in proc.stderr
    assert f"HINT: set {TORCH_AS_IS_VAR}=1 to run torch's agent as it is" in proc.stderr


def test_the_opt_out_runs_torchs_agent_and_trains(tmp_path):
    proc = _launch(tmp_path, 1, {TORCH_AS_IS_VAR: "1"})
    assert proc.returncode == 0, proc.stderr
    assert "[rank 0] sum 3.0" in proc.stdout and "[rank 1] sum 3.0" in proc.stdout
    assert f"{TORCH_AS_IS_VAR} is set: torch's agent runs as it is" in proc.stderr
    assert "lacks" not in proc.stderr  # nothing probed, nothing patched


def test_a_missing_speed_name_is_one_line_and_the_run_goes_on(tmp_path):
    proc = _launch(tmp_path, 0, {})  # without restarts the restart policy is not needed
    assert proc.returncode == 0, proc.stderr
    assert "[rank 1] sum 3.0" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "lacks" in line]
    assert len(lines) == 1 and "_finished_events: log tailers stopped together is off" in lines[0]


def test_the_way_out_undoes_what_an_earlier_launch_of_the_process_patched(tmp_path):
    """A second launch in the same process under SCALETRAIN_TORCH_AS_IS=1 runs torch's own
    agent: the lasting patches the first launch installed are put back (they stayed, before)
    and the launcher's exit tears the interpreter down as Python does (it was skipped)."""
    program = tmp_path / "hello.py"
    program.write_text("print('hello')\n")
    proc = subprocess.run([sys.executable, str(DRIVER.with_name("as_is_driver.py")), str(program)],
                          env=worker_env({}), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    first, second = json.loads(proc.stdout.split("STATE ", 1)[1])
    assert first["code"] == second["code"] == 0
    assert all(first["ours"].values()) and first["skip_teardown"]
    assert not any(second["ours"].values()), second
    assert not second["skip_teardown"]


RENAMED_COUNT = Path(__file__).with_name("renamed_count_driver.py")
FLAKY = """
import os, torch, torch.distributed as dist
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("attempt", attempt, "sum", float(t[0]))
dist.destroy_process_group()
if attempt == 0 and dist is not None:
    raise SystemExit(1)  # the first attempt fails after its step: a restart runs it again
"""


def _renamed_count(tmp_path: Path, restarts: int, program: str) -> subprocess.CompletedProcess:
    path = tmp_path / "program.py"
    path.write_text(program)
    return subprocess.run([sys.executable, str(RENAMED_COUNT), "--nproc-per-node", "2",
                           "--max-restarts", str(restarts), str(path)], env=worker_env({}),
                          capture_output=True, text=True, timeout=300)


def test_an_agent_whose_count_is_renamed_at_instance_level_runs_without_restarts(tmp_path):
    proc = _renamed_count(tmp_path, 0, PROGRAM)
    # before: "workers could not be started: AttributeError: ... '_remaining_restarts'"
    assert proc.returncode == 0, proc.stderr
    assert "[rank 0] sum 3.0" in proc.stdout and "[rank 1] sum 3.0" in proc.stdout
    assert "AttributeError" not in proc.stderr and "is off" not in proc.stderr


def test_with_restarts_the_policy_is_off_in_one_line_and_torch_restarts(tmp_path):
    proc = _renamed_count(tmp_path, 1, FLAKY)
    assert proc.returncode == 0, proc.stderr
    assert "[rank 0] attempt 0 sum 3.0" in proc.stdout and "[rank 1] attempt 1 sum 3.0" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "is off" in line]
    assert len(lines) == 1 and "_remaining_restarts: restart policy is off" in lines[0], proc.stderr
    assert "AttributeError" not in proc.stderr
