"""Tier 1 for failures in a job: the exit-code mapping with error records, the CPU-worker
bound, the run folder's records, stack-dump parsing, and the worker entry in-process."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from scaletrain.contract.environ import EXIT_STOPPED, RUN_DIR_VAR
from scaletrain.errors import UsageError
from scaletrain.launch import frames, rundir, supervise
from scaletrain.launch.inproc import hang, worker
from scaletrain.launch.failure import (FailedRank, exit_code_for, render_tail, root_cause,
                                       worker_failed_error)
from scaletrain.launch.spec import RunRequest, plan_launch


def _f(rank, code, record=None, tail=(), finished=False):
    return FailedRank(rank=rank, local_rank=rank, pid=100 + rank, exitcode=code,
                      stderr_tail=tuple(tail), record=record, finished=finished)


def _rec(rank, kind="error", code=2, **kw):
    return rundir.ErrorRecord(rank=rank, kind=kind, type="UsageError", message=f"bad {rank}",
                              hint="fix it", exit_code=code, **kw)


# -- exit codes ---------------------------------------------------------------------------
@pytest.mark.parametrize("code,want", [(1, 1), (2, 1), (3, 1), (4, 1), (7, 1), (255, 1),
                                       (EXIT_STOPPED, EXIT_STOPPED),
                                       (-signal.SIGKILL, 128 + signal.SIGKILL)])
def test_plain_worker_codes_never_collide_with_scaletrains(code, want):
    assert exit_code_for(_f(0, code)) == want


@pytest.mark.parametrize("code", [2, 3, 4])
def test_a_workers_scaletrain_error_keeps_its_code(code):
    assert exit_code_for(_f(0, code, _rec(0, code=code))) == code
    assert exit_code_for(_f(0, 1, _rec(0, code=99))) == 1  # nothing outside the mapping


def test_records_are_the_root_cause_and_the_message():
    stopped = _f(0, -signal.SIGTERM)
    crashed = _f(1, 1, tail=["ValueError: boom"])
    timeout = _f(2, 1, _rec(2, kind="timeout", code=1, where="t.py:3 in main"))
    error = _f(3, 2, _rec(3, where="t.py:9 in <module>"))
    assert root_cause([stopped, crashed, timeout, error]) is error
    assert root_cause([stopped, crashed, timeout]) is timeout
    err = worker_failed_error([stopped, error])
    assert (err.message, err.hint, err.exit_code, err.rank) == ("bad 3", "fix it", 2, 3)
    assert render_tail(error) == "scaletrain: rank 3 raised UsageError at t.py:9 in <module>"
    assert render_tail(timeout) == "scaletrain: rank 2 timed out at t.py:3 in main"


# -- restarts -----------------------------------------------------------------------------
class _PF:
    def __init__(self, code):
        self.exitcode = code


@pytest.mark.parametrize("code", [-signal.SIGABRT, 134, 250])
def test_an_abort_after_the_program_returned_says_so_with_the_workaround(code):
    err = worker_failed_error([_f(0, -signal.SIGTERM), _f(1, code, finished=True)])
    assert err.message.startswith("rank 1 (local rank 1, pid 101) finished its program, then "
                                  "aborted while Python shut down (")
    assert "'terminate called without an active exception'" in err.message
    assert "\n" not in err.message and err.hint.startswith("the training itself completed")
    assert "deepspeed.comm.destroy_process_group()" in err.hint
    assert err.exit_code == (128 + signal.SIGABRT if code < 0 else 1)


@pytest.mark.parametrize("code,finished", [(-signal.SIGABRT, False), (-signal.SIGSEGV, True), (1, True)])
def test_other_ends_keep_the_plain_message(code, finished):
    err = worker_failed_error([_f(1, code, finished=finished)])
    assert "finished its program" not in err.message and "the other workers were stopped" in err.message


def test_restart_is_refused_when_it_would_repeat(tmp_path):
    assert supervise.no_restart_reason({1: _PF(1)}, str(tmp_path)) is None
    assert "stopped on purpose" in supervise.no_restart_reason({1: _PF(EXIT_STOPPED)}, str(tmp_path))
    rundir.write_error(tmp_path, _rec(1, code=3))
    assert "fail the same way" in supervise.no_restart_reason({1: _PF(3)}, str(tmp_path))
    rundir.clear_errors(tmp_path)
    rundir.write_error(tmp_path, _rec(1, kind="timeout", code=1))
    assert supervise.no_restart_reason({1: _PF(1)}, str(tmp_path)) is None  # a hang may pass
    rundir.write_finished(tmp_path, 2)   # rank 2 aborted while Python shut down, training done
    assert "after its program had finished; not restarting" in \
        supervise.no_restart_reason({2: _PF(-6)}, str(tmp_path))


# -- CPU worker bound ---------------------------------------------------------------------
def test_too_many_cpu_workers_are_refused_before_spawning(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    with pytest.raises(UsageError) as info:
        plan_launch(RunRequest(target=str(script), nproc_per_node=100000), environ={}, gpus=0,
                    cores=2)
    assert "100000 worker processes on 2 core(s)" in info.value.message
    assert "--nproc-per-node 2" in info.value.hint
    with pytest.raises(UsageError, match="--procs-per-gpu asks for 100000 worker processes"):
        plan_launch(RunRequest(target=str(script), procs_per_gpu=100000), environ={}, gpus=1,
                    cores=2)
    assert plan_launch(RunRequest(target=str(script), nproc_per_node=8), environ={}, gpus=0,
                       cores=2).nproc_per_node == 8  # a few per core stays possible (tests)


def test_timeout_reaches_the_workers(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    plan = plan_launch(RunRequest(target=str(script), timeout_s=2.5), environ={}, gpus=0)
    assert plan.worker_env["SCALETRAIN_TIMEOUT"] == "2.5"
    with pytest.raises(UsageError, match="--timeout"):
        plan_launch(RunRequest(target=str(script), timeout_s=0.0), environ={}, gpus=0)


# -- run folder and stacks ----------------------------------------------------------------
def test_records_round_trip_and_bad_files_are_skipped(tmp_path):
    rundir.write_error(tmp_path, _rec(1, missing=[2]))
    (tmp_path / "errors" / "rank-9.json").write_text("{half")
    assert rundir.read_errors(tmp_path) == {1: _rec(1, missing=[2])}
    assert rundir.read_errors(None) == {}


def test_temporary_run_folder_is_kept_only_with_stacks():
    with supervise.run_folder(None) as quiet:
        pass
    with supervise.run_folder(None) as hung:
        rundir.stack_path(hung, 0).parent.mkdir()
        rundir.stack_path(hung, 0).write_text("Thread 0x1 ...")
    import os
    import shutil
    assert not os.path.exists(quiet) and os.path.exists(hung)
    shutil.rmtree(hung)


TORCH = frames.package_dir("torch") or "/site-packages/torch"   # found, not imported
DUMP = f'''Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f0000000001 (most recent call first):
  File "{TORCH}/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/work/train.py", line 10 in <module>

Current thread 0x00007f0000000003 (most recent call first):
  File "/home/u/torch/distributed/my_train.py", line 7 in <module>
'''


def test_main_thread_frame_picks_the_right_thread():
    frame = hang.main_thread_frame(DUMP, 0x7F0000000001)
    assert frame is not None and frame.func == "all_reduce" and frame.waiting
    other = hang.main_thread_frame(DUMP, 0x7F0000000002)
    assert other is not None and not other.waiting and other.line == 320
    assert hang.main_thread_frame(DUMP, 0x1234) is None
    # a user's own folder named torch/distributed is not torch's: that rank is not "waiting"
    mine = hang.main_thread_frame(DUMP, 0x7F0000000003)
    assert mine is not None and mine.line == 7 and not mine.waiting


@pytest.mark.parametrize("text,want", [
    ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation", True),
    ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)", True),
    ("Connection closed by peer [127.0.0.1]:5 (timeout?)", False),
    ("shape mismatch", False)])
def test_collective_timeouts_are_recognised(text, want):
    assert hang.is_collective_timeout(RuntimeError(text)) is want
    assert not hang.is_collective_timeout(ValueError(text))


# -- the worker entry, in this process ----------------------------------------------------
@pytest.fixture
def entry(monkeypatch, tmp_path):
    monkeypatch.setattr(worker, "die_with_parent", lambda: True)  # never on pytest itself
    monkeypatch.setenv(RUN_DIR_VAR, str(tmp_path / "run"))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


def test_worker_turns_a_scaletrain_error_into_a_record(entry, capsys):
    script = entry / "train.py"
    script.write_text("import sys\nfrom scaletrain.errors import DistEnvError\n"
                      "assert sys.argv == [__file__, '--x', '1'], sys.argv\n"
                      "raise DistEnvError('env is odd', 'unset X')\n")
    assert worker.main([str(script), "--x", "1"]) == 3
    record = json.loads((entry / "run" / "errors" / "rank-1.json").read_text())
    assert record["message"] == "env is odd" and record["exit_code"] == 3
    assert record["where"].endswith("train.py:4 in <module>")
    assert capsys.readouterr().err == ""   # the launcher renders it, once
    assert not list((entry / "run" / "stacks").glob("*"))  # nobody asked: no stack file


@pytest.mark.parametrize("ending,code,marked", [("pass", 0, True), ("raise SystemExit(0)", 0, True),
                                                ("raise SystemExit(3)", 3, False),
                                                ("raise ValueError('x')", 1, False)])
def test_worker_marks_a_program_that_returned(entry, capsys, ending, code, marked):
    script = entry / "train.py"
    script.write_text(ending + "\n")
    try:
        got = worker.main([str(script)])
    except SystemExit as exc:
        got = exc.code
    assert got == code
    assert rundir.read_finished(entry / "run") == ({1} if marked else set())
    rundir.clear_errors(entry / "run")   # a restart forgets it
    assert rundir.read_finished(entry / "run") == set()


def test_worker_keeps_user_tracebacks_without_its_own_frames(entry, capsys):
    script = entry / "train.py"
    script.write_text("def f():\n    raise ValueError('mine')\nf()\n")
    assert worker.main([str(script)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: mine" in err and 'train.py", line 3' in err
    assert "runpy" not in err and "worker.py" not in err
    assert not (entry / "run" / "errors").exists()


@pytest.mark.parametrize("folder", ["scaletrain", "torch", "src/scaletrain/launch"])
def test_worker_names_the_users_line_in_a_folder_named_like_ours(entry, folder):
    # a clone of this project is a folder named scaletrain; users name folders torch: their
    # frames are theirs, recognised by where the packages really are, not by a word in a path
    script = entry / folder / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text("from scaletrain.errors import DistEnvError\n\n"
                      "def main():\n    raise DistEnvError('env is odd', 'unset X')\n\nmain()\n")
    assert worker.main([str(script)]) == 3
    record = json.loads((entry / "run" / "errors" / "rank-1.json").read_text())
    assert record["where"].endswith(f"{folder}/train.py:4 in main"), record


def test_frames_are_ours_by_the_packages_real_folders(tmp_path):
    assert not frames.is_user_frame(worker.__file__) and not frames.is_user_frame(hang.__file__)
    for name in ("scaletrain/launch/worker.py", "torch/distributed/x.py", "lib/runpy.py"):
        assert frames.is_user_frame(str(tmp_path / name)), name
    link = tmp_path / "pkg"
    link.symlink_to(frames.package_dir("scaletrain"))   # our files reached through a link
    assert not frames.is_user_frame(str(link / "launch" / "worker.py"))
    assert frames.is_user_frame("<string>")
