"""The launcher against programs that misbehave in ways a launch must survive: a program that
forks and leaves the child through its own frames, a run folder used before or written over, a
stack request to a process that would die of it, a save request after the program returned, a
last line without its end. Real launches are in tests/multiproc/test_launch_hostile_runs.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.contract.environ import AGENT_PID_VAR, RUN_DIR_VAR
from scaletrain.launch import rundir
from scaletrain.launch.inproc import hang
from scaletrain.launch.signals import Forwarding, stop_outcome

REPO_SRC = str(Path(__file__).resolve().parents[2] / "src")

# the program forks; the child leaves through the program's frames (sys.exit, or an error), the
# parent reports whether its stack file is still there and exits 3 (it never returned)
FORKS = """
import os, sys
from pathlib import Path
stack = Path(os.environ["SCALETRAIN_RUN_DIR"], "stacks", "rank-0.txt")
pid = os.fork()
if pid == 0:
    if sys.argv[1] == "exit":
        sys.exit(0)
    raise ValueError("the child's own error")
os.waitpid(pid, 0)
print("stack file kept:", stack.exists(), flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("how", ["exit", "raise"])
def test_a_forked_child_leaving_through_the_program_leaves_its_parents_records(tmp_path, how):
    program = tmp_path / "forks.py"
    program.write_text(FORKS)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**os.environ, RUN_DIR_VAR: str(run_dir), "RANK": "0", "PYTHONPATH": REPO_SRC}
    env.pop(AGENT_PID_VAR, None)
    proc = subprocess.run([sys.executable, "-m", "scaletrain.launch.worker", str(program), how],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    # before: the child marked rank 0 finished while its parent ran on (exit), or closed and
    # removed the parent's stack file (raise), so no stack could be asked of it again
    assert not rundir.read_finished(run_dir)
    assert "stack file kept: True" in proc.stdout


def test_a_run_folder_used_before_forgets_this_nodes_ranks_only(tmp_path):
    for rank in (0, 1, 2):
        rundir.write_rank_info(tmp_path, rundir.RankInfo(rank=rank, host="h", pid=1, thread=1))
        rundir.write_finished(tmp_path, rank, [])
        rundir.write_error(tmp_path, rundir.ErrorRecord(rank=rank, kind="error", type="E",
                                                        message="old"))
    (tmp_path / "finished" / "rank-3").mkdir()   # a folder of that name: no mark of ours
    rundir.forget_ranks(tmp_path, [0, 1, 3])
    assert set(rundir.read_rank_infos(tmp_path)) == {2}   # another node's, of this run
    assert rundir.read_finished(tmp_path) == {2} and set(rundir.read_errors(tmp_path)) == {2}
    assert (tmp_path / "finished" / "rank-3").is_dir()


def _start(code: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": REPO_SRC, **(env or {})})
    proc.stdout.readline()   # up, its handler installed
    return proc


CATCHES = ("import faulthandler, sys, time\n"
           "from scaletrain.launch.inproc import hang\n"
           "faulthandler.register(hang.stack_signal(), file=sys.stderr)\n"
           "print('up', flush=True); time.sleep(120)")


@pytest.mark.parametrize("marked", [True, False])
def test_a_stack_request_goes_only_to_a_worker_of_this_run(tmp_path, marked):
    """A pid in the run folder may be anyone's by now (a program wrote it, or it was reused)."""
    proc = _start(CATCHES, {AGENT_PID_VAR: str(os.getpid())} if marked else {})
    try:
        rundir.write_rank_info(tmp_path, rundir.RankInfo(rank=0, host=os.uname().nodename,
                                                         pid=proc.pid, thread=0))
        asked = hang._request_stacks(str(tmp_path), skip=set())
        assert set(asked) == ({0} if marked else set())
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_save_request_a_program_could_not_handle_is_a_stop_not_a_failure():
    state = Forwarding(received=["SIGUSR1"])
    usr1 = int(signal.SIGUSR1)
    # before: "rank 0 was killed by SIGUSR1 ... fix the error and run again"
    assert stop_outcome(state, [-usr1, -usr1]) == (128 + usr1, (
        "scaletrain: received SIGUSR1; the workers had no handler for it (a program without a "
        "stop handler, or one still starting) and ended by it: stopped, not failed"))
    assert stop_outcome(state, [-usr1, 1]) is None            # one failed on its own
    assert stop_outcome(Forwarding(), [-usr1]) is None        # no USR1 was passed on: a failure
