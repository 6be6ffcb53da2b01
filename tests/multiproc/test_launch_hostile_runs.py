"""`scaletrain run` against programs that misbehave around its own machinery: a launcher with
stdout closed, a save request (SIGUSR1) once every worker has finished its program, a program
that writes over its record in the run folder or removes the folder. Each run ends, with the
training's exit code and no traceback. The cases of a single rule are in
tests/unit/test_launch_hostile.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workers import ALLREDUCE, launcher_cmd, worker_env

from scaletrain.contract.environ import TEARDOWN_WAIT_VAR

pytestmark = pytest.mark.multiproc

TRAINS = ALLREDUCE
# after training, the exit waits on a non-daemon thread asleep (each rank)
HOLDS = TRAINS + """
import threading, time
threading.Thread(target=time.sleep, args=(600,), name="holder").start()
"""
OVERWRITES = TRAINS.replace("dist.destroy_process_group()", """
import os, shutil
from pathlib import Path
run_dir = Path(os.environ["SCALETRAIN_RUN_DIR"])
if dist.get_rank() == 0:   # its own record now names another process
    (run_dir / "ranks" / "rank-0.json").write_text(
        '{"rank": 0, "host": "elsewhere", "pid": 1, "thread": 1}')
dist.barrier()
if dist.get_rank() == 1:   # then the whole folder goes
    shutil.rmtree(run_dir, ignore_errors=True)
dist.destroy_process_group()
""") + HOLDS[len(TRAINS):]


def _program(tmp_path: Path, text: str) -> str:
    path = tmp_path / "program.py"
    path.write_text(text)
    return str(path)


def _ended_with_the_training(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr
    assert "[rank 0] sum 3.0" in proc.stdout and "[rank 1] sum 3.0" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_a_launcher_with_stdout_closed_runs_and_says_nothing_wrong(tmp_path):
    cmd = [*launcher_cmd(2), _program(tmp_path, TRAINS)]
    proc = subprocess.run(["bash", "-c", 'exec "$@" >&-', "launch", *cmd], env=worker_env(),
                          capture_output=True, text=True, timeout=300)
    # before: AttributeError: 'NoneType' object has no attribute 'flush', exit 1
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_a_program_that_writes_over_its_record_or_removes_the_folder_still_ends(tmp_path):
    proc = subprocess.run([*launcher_cmd(2), _program(tmp_path, OVERWRITES)],
                          env=worker_env({TEARDOWN_WAIT_VAR: "2"}), capture_output=True,
                          text=True, timeout=300)
    # before: never ended (and pid 1 was sent SIGKILL every two seconds)
    _ended_with_the_training(proc)
    assert "(pid 1)" not in proc.stderr
    assert proc.stderr.count("none of its threads used CPU") == 2, proc.stderr


def test_a_save_request_after_every_program_returned_is_not_passed_on(tmp_path):
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen([*launcher_cmd(2, ["--run-dir", str(run_dir)]),
                                 _program(tmp_path, HOLDS)],
                                env=worker_env({TEARDOWN_WAIT_VAR: "5"}),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while len(list((run_dir / "finished").glob("rank-*"))) < 2 and launcher.poll() is None:
            time.sleep(0.1)   # until both programs have returned (bounded by the test's timeout)
        os.kill(launcher.pid, signal.SIGUSR1)   # a time limit nears, with nothing left to save
        out, err = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
    # before: forwarded, it killed the workers in their exit: "rank 0 was killed by SIGUSR1"
    _ended_with_the_training(subprocess.CompletedProcess(launcher.args, launcher.returncode,
                                                         out, err))
    assert "received SIGUSR1; not passed to the workers that finished their program" in err
