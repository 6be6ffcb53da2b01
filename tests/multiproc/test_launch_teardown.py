"""A run that finished training always ends, and nothing a program still does is lost: after the
last step, a rank whose exit does not end is named in one line (its pid, the threads its exit
waits on and where), ended when none of its threads works (a teardown stuck in torch, a
non-daemon thread asleep, a deadlock in the program's own frames), left to finish when one
works (a thread, or a child process it waits for); the launch exits 0, the training's result;
a clean run says nothing of it.

One `scaletrain run` of two workers takes 6 to 10 s on the 2-core CI machine (three torch
imports), so each shape runs once (the stuck one twice, as before).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from workers import launcher_cmd, worker_env

from scaletrain.contract.environ import TEARDOWN_WAIT_VAR

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("teardown_worker.py")


def _run(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess, Path]:
    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    # the timeout ends the launch should it never end by itself (the failure this guards)
    proc = subprocess.run([*launcher_cmd(2, ["--run-dir", str(run_dir)]), str(WORKER), str(out),
                           mode], env=worker_env({TEARDOWN_WAIT_VAR: "2"}),
                          capture_output=True, text=True, timeout=300)
    return proc, out


def _trained(out: Path) -> None:
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] and len(ranks[0]) == 4  # DDP kept both ranks equal


def _named(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if "had not exited" in line]
    assert len(lines) == 1, proc.stderr
    assert re.match(r"scaletrain: rank 0 \(pid \d+\) finished training but had not exited "
                    r"[\d.]+ s later; its exit waits on ", lines[0]), lines[0]
    return lines[0]


def _ended(proc: subprocess.CompletedProcess, tmp_path: Path, where: str,
           stack: str = "teardown_worker.py") -> None:
    line = _named(proc)
    assert where in line, line
    assert "none of its threads used CPU in the last 2 s: ended it" in line
    assert stack in (tmp_path / "run" / "stacks" / "rank-0.txt").read_text()
    assert "ranks stuck in teardown were stopped" in proc.stderr


@pytest.mark.parametrize("attempt", [1, 2])
def test_a_rank_stuck_in_teardown_is_named_stopped_and_the_run_succeeds(tmp_path, attempt):
    proc, out = _run(tmp_path, "stuck")
    assert proc.returncode == 0, proc.stderr  # before: waited for ever, printing nothing
    _trained(out)
    _ended(proc, tmp_path, "its main thread at ")
    assert "store.py" in _named(proc) and "in barrier" in _named(proc)


def test_a_non_daemon_thread_asleep_is_named_and_the_run_ends(tmp_path):
    proc, out = _run(tmp_path, "sleeper")
    assert proc.returncode == 0, proc.stderr  # before: never ended, even with the variable set
    _trained(out)
    _ended(proc, tmp_path, "thread 'sleeper' at ", stack="in _shutdown")


def test_a_deadlock_in_the_programs_own_frames_is_ended(tmp_path):
    proc, out = _run(tmp_path, "deadlock")
    assert proc.returncode == 0, proc.stderr  # before: left alone for ever
    _trained(out)
    _ended(proc, tmp_path, "its main thread at ")
    assert re.search(r"its main thread at \S*teardown_worker\.py:\d+ in <module>", _named(proc))


@pytest.mark.parametrize("mode, where, works", [
    # where the program is, and where inside it the thread was at that instant (pathlib's stat)
    ("working", r"\S*teardown_worker\.py:\d+ in upload(, inside \S+:\d+ in \w+)?", "thread 'uploader' ("),
    ("child", r"\S*teardown_worker\.py:\d+ in upload_in_a_child, inside \S*subprocess\.py:\d+ in \w+",
     "its child process ")])
def test_a_thread_still_working_is_left_to_finish_and_said_so(tmp_path, mode, where, works):
    proc, out = _run(tmp_path, mode)
    assert proc.returncode == 0, proc.stderr
    _trained(out)
    line = _named(proc)
    assert re.search(f"its exit waits on thread 'uploader' at {where};", line), line
    assert works in line, line
    assert "still works: left to finish, and ended if it has not exited 3600 s after " \
           "training (SCALETRAIN_TEARDOWN_WORK_TIMEOUT)" in line
    assert (out / "uploaded").read_text() == "whole"   # nothing it still did was lost
    assert "ended it" not in proc.stderr and "stopped" not in proc.stderr


def test_a_clean_teardown_says_nothing(tmp_path):
    proc, out = _run(tmp_path, "clean")
    assert proc.returncode == 0, proc.stderr
    _trained(out)
    assert "had not exited" not in proc.stderr
    assert not list((tmp_path / "run" / "stacks").glob("*.txt"))  # the empty ones were dropped


def test_a_run_folder_used_before_marks_no_rank_finished(tmp_path):
    """An earlier run's records in a --run-dir used again: finished marks for every rank, and a
    rank file naming a live process that is no worker of this run."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        old = tmp_path / "run"
        for rank in (0, 1):
            (old / "finished").mkdir(parents=True, exist_ok=True)
            (old / "finished" / f"rank-{rank}").write_text("")
            (old / "ranks").mkdir(exist_ok=True)
            (old / "ranks" / f"rank-{rank}.json").write_text(json.dumps(
                {"rank": rank, "host": socket.gethostname(), "pid": stranger.pid, "thread": 1}))
        proc, out = _run(tmp_path, "pause")
        # before: both ranks were taken for finished and ended in the middle of training
        assert proc.returncode == 0, proc.stderr
        _trained(out)
        assert "had not exited" not in proc.stderr
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
