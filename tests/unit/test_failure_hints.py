"""The line a user reads after a failure names the cause and the fix: the launcher's reading of a
failed rank's stderr (torch's [rankN]: prefix, the program's own line, a launcher variable read
without a default), the single-process hint, the console's lines (one prefix, a progress bar cut
at its carriage returns), a clean run's end, the teardown line's path, and the CLI's hints for a
mistyped flag, a folder with no job and a machine where no Slurm cluster answers. The real
launches of programs shaped like the centre guides' are tests/multiproc/test_hints_corpus.py."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading

import pytest
from helpers import run_cli

from scaletrain.contract.environ import AGENT_PID_VAR
from scaletrain.errors import SlurmError
from scaletrain.launch import group_check, reaper, rundir, teardown
from scaletrain.launch.excerpt import missing_variable_hint, traceback_excerpt
from scaletrain.launch.failure import FailedRank, render_tail, worker_failed_error
from scaletrain.launch.inproc import group_record
from scaletrain.launch.tailer import tail_logfile
from scaletrain.slurm import commands

AFTER_INIT = """[rank0]: Traceback (most recent call last):
[rank0]:   File "/home/u/course/ddp.py", line 21, in <module>
[rank0]:     main()
[rank0]:   File "/home/u/course/ddp.py", line 15, in main
[rank0]:     local_rank = setup()
[rank0]:                  ^^^^^^^
[rank0]:   File "/home/u/course/ddp.py", line 8, in setup
[rank0]:     local_rank = int(os.environ["SLURM_LOCALID"])
[rank0]:                      ~~~~~~~~~~^^^^^^^^^^^^^^^^^
[rank0]:   File "<frozen os>", line 679, in __getitem__
[rank0]: KeyError: 'SLURM_LOCALID'""".splitlines()

GETENV = """Traceback (most recent call last):
  File "/home/u/ddp.py", line 30, in <module>
    main()
  File "/home/u/ddp.py", line 12, in main
    rank = int(os.getenv("SLURM_NODEID")) * 4 + int(os.getenv('SLURM_LOCALID'))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
TypeError: int() argument must be a string, a bytes-like object or a real number, not 'NoneType'""".splitlines()


def test_a_variable_read_after_init_process_group_is_named():
    hint = missing_variable_hint(AFTER_INIT, None)
    assert hint is not None and hint.startswith("the program reads SLURM_LOCALID, which srun sets")
    assert "'scaletrain run --emulate slurm'" in hint


@pytest.mark.parametrize("emulate, said", [(None, "run it with 'scaletrain run --emulate slurm'"),
                                           ("slurm", "srun sets it only when the job asks for it")])
def test_int_of_getenv_on_a_missing_variable_is_named(emulate, said):
    hint = missing_variable_hint(GETENV, emulate)
    assert hint is not None and hint.startswith("the program reads SLURM_NODEID, which srun sets"), hint
    assert said in hint


@pytest.mark.parametrize("code", ['x = int(os.getenv("SLURM_LOCALID", "0")) + bad',   # a default
                                  "x = int(config.get('SLURM_LOCALID'))",            # not the environment
                                  'x = int(os.getenv("MY_SETTING"))'])               # not a launcher's
def test_none_errors_of_other_shapes_keep_the_plain_hint(code):
    tail = [*GETENV[:4], f"    {code}", GETENV[-1]]
    assert missing_variable_hint(tail, None) is None


def test_the_excerpt_starts_at_the_programs_own_line():
    excerpt = traceback_excerpt(AFTER_INIT)
    assert excerpt is not None
    assert excerpt.where == "/home/u/course/ddp.py:8 in setup"
    assert excerpt.code == 'local_rank = int(os.environ["SLURM_LOCALID"])'
    assert excerpt.error == ("KeyError: 'SLURM_LOCALID'",)
    text = render_tail(FailedRank(rank=0, local_rank=0, pid=7, exitcode=1, stderr_tail=tuple(AFTER_INIT)))
    assert text.splitlines() == ["scaletrain: rank 0 failed at /home/u/course/ddp.py:8 in setup:",
                                 '  |     local_rank = int(os.environ["SLURM_LOCALID"])',
                                 "  | KeyError: 'SLURM_LOCALID'"]


def test_a_rank_kept_off_the_console_gets_its_last_lines_without_torchs_prefix():
    item = FailedRank(rank=1, local_rank=1, pid=7, exitcode=1, stderr_tail=tuple(AFTER_INIT))
    lines = render_tail(item, shown=False).splitlines()
    assert lines[0] == "scaletrain: last lines of rank 1's stderr:"
    assert lines[1] == "  | Traceback (most recent call last):" and "[rank0]" not in "".join(lines)


def test_the_hint_after_a_traceback_points_at_the_excerpt():
    tail = (*GETENV[:-1], "ValueError: bad learning rate")
    error = worker_failed_error([FailedRank(rank=0, local_rank=0, pid=7, exitcode=1, stderr_tail=tail)])
    assert error.hint.startswith("the lines above are the program's line that raised and its error")


def _exit_records(folder, names_group: bool | None, ranks=("0", "1")) -> group_record.Records:
    for rank in ranks:
        extra = {} if names_group is None else {"names_group": names_group}
        (folder / f"exit-rank{rank}-pid1.json").write_text(json.dumps({"rank": rank, **extra}))
    return group_record.read_records(folder)


@pytest.mark.parametrize("cpu", [True, False])
def test_a_program_without_any_group_call_is_told_it_is_single_process(tmp_path, cpu):
    text = group_check.verdict(_exit_records(tmp_path, False), expected_world=2,
                               local_ranks=["0", "1"], cpu=cpu)
    hint = text.split("\nHINT: ", 1)[1]
    assert hint.startswith("the program never calls init_process_group") and "--nproc-per-node 1" in hint
    assert "condition around" not in hint and "under a launcher it recognises" not in hint


def test_a_program_with_a_group_call_keeps_the_hint_about_its_condition(tmp_path):
    text = group_check.verdict(_exit_records(tmp_path, True), expected_world=2,
                               local_ranks=["0", "1"], cpu=True)
    assert "look for the condition around its init_process_group call" in text


def test_the_worker_says_whether_its_program_names_a_group_call(tmp_path):
    program, helper = tmp_path / "train.py", tmp_path / "ddp_utils.py"
    program.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\n")
    helper.write_text("def setup():\n    pass\n")
    assert group_record.names_a_group([str(program), str(helper)]) is False
    helper.write_text("import torch.distributed as dist\ndef setup():\n    dist.init_process_group('gloo')\n")
    assert group_record.names_a_group([str(program), str(helper)]) is True


def _tail(data: bytes, tmp_path, header: str = "[rank 0] ") -> str:
    log = tmp_path / "0.log"
    log.write_bytes(data)
    finished = threading.Event()
    finished.set()
    out = io.StringIO()
    tail_logfile(header, str(log), out, finished, 0.01)
    return out.getvalue()


def test_torchs_rank_prefix_is_not_repeated_after_ours(tmp_path):
    got = _tail(b"[rank3]: Traceback (most recent call last):\n[rank3]:   File \"x.py\"\n"
                b"[rank3]:[W1027 12:00:00.0 ProcessGroup.cpp:9] warning\n[rank1]: another rank's\n",
                tmp_path, header="[rank 3] ")
    assert got.splitlines() == ["[rank 3] Traceback (most recent call last):", '[rank 3]   File "x.py"',
                                "[rank 3] [W1027 12:00:00.0 ProcessGroup.cpp:9] warning",
                                "[rank 3] [rank1]: another rank's"]


def test_a_carriage_return_progress_bar_is_cut_into_lines(tmp_path):
    bar = b"".join(b"\rEpoch 0: %3d%%|" % p for p in (10, 50, 100)) + b"\n"
    got = _tail(b"start\n" + bar + b"crlf line\r\nend", tmp_path)
    assert got == ("[rank 0] start\n[rank 0] Epoch 0:  10%|\n[rank 0] Epoch 0:  50%|\n"
                   "[rank 0] Epoch 0: 100%|\n[rank 0] crlf line\r\n[rank 0] end\n")   # the last line ended


def test_a_carriage_return_written_apart_from_its_newline_is_one_line_end(tmp_path):
    """A \\r at the end of what was written so far may be half of a \\r\\n still to come."""
    log = tmp_path / "0.log"
    log.write_bytes(b"half\r")
    finished = threading.Event()
    out = io.StringIO()
    tailer = threading.Thread(target=tail_logfile, args=("[rank 0] ", str(log), out, finished, 0.01))
    tailer.start()
    try:
        while not out.getvalue():
            finished.wait(0.01)
        with log.open("ab") as fh:
            fh.write(b"\nnext\r")
    finally:
        finished.set()
        tailer.join()
    assert out.getvalue() == "[rank 0] half\r\n[rank 0] next\n"


def _marked_child(code: str, *args: str) -> subprocess.Popen:
    """A process as a worker's child is: it carries the launcher's PID."""
    return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                            env={**os.environ, AGENT_PID_VAR: str(os.getpid())})


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_pythons_resource_tracker_ending_by_itself_is_not_a_leak(capsys, tmp_path):
    """mp.spawn's resource tracker outlives its worker until it reads the end of its pipe; the
    run stopped it (SIGTERM) and said it had been left running."""
    # the tracker's shape: waits for its pipe to close, cleans up, exits (its command line names
    # multiprocessing.resource_tracker, as the real one's does)
    ended = tmp_path / "ended"
    code = ("import pathlib, sys, time\nimport multiprocessing.resource_tracker\nsys.stdin.read()\n"
            "time.sleep(0.3)\npathlib.Path(sys.argv[1]).write_text('by itself')\n")
    with reaper.ending_with_run(30.0):
        child = _marked_child(code, str(ended))
        child.stdin.close()   # its worker has ended
    assert _gone(child.pid) and ended.read_text() == "by itself"   # not signalled
    assert "left running" not in capsys.readouterr().err


def test_a_child_caught_inside_exec_is_still_found_as_the_runs(monkeypatch):
    """Popen returns once exec closes its close-on-exec pipe, before the kernel lays out the new
    program's environment: read then, /proc/PID/environ is empty, and the reaper passed the child
    by as not the run's (CI: the resource-tracker test above failed once, at load)."""
    child = _marked_child("import sys; sys.stdin.read()\n")
    try:
        real, reads = rundir._environ_bytes, []

        def mid_exec_first(pid: int) -> bytes | None:
            reads.append(pid)
            return b"" if len(reads) <= 3 else real(pid)

        monkeypatch.setattr(rundir, "_environ_bytes", mid_exec_first)
        assert child.pid in reaper.run_processes(set())
        assert len(reads) == 4
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_a_zombies_empty_environment_is_not_waited_on(monkeypatch):
    child = _marked_child("")
    child.stdin.close()
    while not _gone(child.pid):   # a zombie: ended, not yet collected
        threading.Event().wait(0.01)
    monkeypatch.setattr(rundir, "_EXEC_SETTLE_S", 60.0)   # would hang the test if waited on
    try:
        assert rundir.environ_of(child.pid) == []
    finally:
        child.wait(timeout=30)


def test_a_process_the_workers_left_is_still_stopped_and_named(capsys):
    with reaper.ending_with_run(30.0):
        child = _marked_child("import time\ntime.sleep(120)\n")
    assert _gone(child.pid)
    assert f"left running (PIDs {child.pid})" in capsys.readouterr().err
    child.stdin.close()


def test_the_teardown_line_names_the_stack_file_as_the_users_shell_would(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dump = (f"Current thread 0x{7:016x} (most recent call first):\n"
            f'  File "{tmp_path / "train.py"}", line 3 in main\n')
    monkeypatch.setattr(teardown.hang, "stacks_of", lambda run_dir, skip, infos=None: {0: dump})
    run_dir = tmp_path / "runs" / "one"
    (run_dir / "groups").mkdir(parents=True)
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # no CPU
    try:
        rundir.write_rank_info(run_dir, rundir.RankInfo(rank=0, host=socket.gethostname(), pid=stuck.pid,
                                                        thread=0))
        rundir.write_finished(run_dir, 0)
        out = io.StringIO()
        watch = teardown.TeardownWatch(str(run_dir), str(run_dir / "groups"), [0],
                                       teardown.Bounds(wait_s=1, work_s=3600), out=out)
        watch.poll(0.0)
        watch.poll(2.0)
        assert stuck.wait(timeout=30) == -9
    finally:
        stuck.kill()
        stuck.wait()
    line = out.getvalue()
    assert "(its stack: runs/one/stacks/rank-0.txt)" in line and str(tmp_path) not in line


@pytest.mark.parametrize("argv, meant", [
    (("run", "--nproc", "2", "x.py"), "--nproc-per-node"),
    (("run", "--nproc_per_node", "2", "x.py"), "--nproc-per-node"),
    (("plan", "--gpu", "2", "x.py"), "--gpus"),
])
def test_a_mistyped_flag_gets_the_one_it_meant(capsys, argv, meant):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert f"HINT: did you mean {meant}?" in err


def test_logs_of_a_folder_with_no_job_says_so(capsys, tmp_path):
    for follow in ((), ("--follow",)):
        code, out, err = run_cli(capsys, "logs", str(tmp_path), *follow)
        assert code == 2 and out == ""
        assert f"error: {tmp_path} holds no job" in err


def test_logs_of_a_job_with_no_output_yet_says_so(capsys, tmp_path):
    (tmp_path / "job_id").write_text("123\n")
    code, out, err = run_cli(capsys, "logs", str(tmp_path))
    assert code == 0 and out == "" and "no output yet: job 123" in err


@pytest.mark.parametrize("said, off_cluster", [
    ("sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
     "sbatch: fatal: Could not establish a configuration source", True),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller "
     "(connect failure)", True),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition "
     "combination specified", False),
])
def test_a_machine_where_no_cluster_answers_is_not_told_to_fix_the_request(tmp_path, said, off_cluster):
    fake = tmp_path / "sbatch"
    lines = " ".join("'" + line + "'" for line in said.splitlines())
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' {lines} >&2\nexit 1\n")   # builtins only: PATH is bare
    fake.chmod(0o755)
    with pytest.raises(SlurmError) as info:
        commands.sbatch_parsable("job.sh", env={"PATH": str(tmp_path)})
    assert info.value.message == f"sbatch failed: {said.splitlines()[-1]}"
    assert ("fix the request" in info.value.hint) is not off_cluster
    assert ("run this on the cluster's login node" in info.value.hint) is off_cluster
