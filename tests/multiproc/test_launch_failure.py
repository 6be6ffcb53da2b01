"""A failing worker: `scaletrain run` names the rank, stops the rest, leaves nothing behind.

Three launches: rank 1 raises while rank 0 sleeps (only the launcher can stop it); a job
that fails on its first attempt and succeeds on the one --max-restarts 1 allows; and SIGTERM
to the launcher of a sleeping job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import alive as _alive
from workers import launcher_cmd, run_workers, worker_env

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("launch_fail_worker.py")


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    out = tmp_path_factory.mktemp("crash")
    start = time.monotonic()
    proc = subprocess.run([*launcher_cmd(2), str(WORKER), str(out), "raise"], env=worker_env(),
                          capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    pids = {int(p.name[3]): int(p.read_text()) for p in out.glob("pid*.attempt0")}
    return proc, elapsed, pids


def test_exits_non_zero_quickly(crashed):
    proc, elapsed, pids = crashed
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the worker's own exit code
    assert elapsed < 300  # ended by the launcher, not by rank 0's 300 s sleep (no tighter: load)
    assert sorted(pids) == [0, 1]  # both workers really ran


def test_error_names_the_rank_and_shows_its_stderr(crashed):
    proc, _, _ = crashed
    err = proc.stderr
    assert "scaletrain: error: rank 1 (local rank 1" in err
    assert "exited with code 1" in err
    # the program's own line that raised and the error, once (its traceback was on the console)
    tail = err.split("scaletrain: rank 1 failed at tests/multiproc/launch_fail_worker.py:", 1)[1]
    assert tail.splitlines()[1:3] == ['  |     raise ValueError("boom-from-rank-1")',
                                      "  | ValueError: boom-from-rank-1"], err
    assert err.count("Traceback (most recent call last)") == 1
    assert "Traceback" not in err.split("scaletrain: error:", 1)[1]  # no launcher traceback


def test_no_worker_survives(crashed):
    _, _, pids = crashed
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids.values()):
        time.sleep(0.1)
    survivors = [p for p in pids.values() if _alive(p)]
    for pid in survivors:  # clean up before failing
        os.kill(pid, 9)
    assert not survivors


def test_native_crash_shows_the_python_stack(tmp_path):
    """A rank killed by SIGABRT (heap corruption, a failed C++ check) raises nothing in Python:
    the launcher shows the stack faulthandler left in the run folder, keeps that file, and
    exits 128 + 6."""
    run_dir = tmp_path / "run"
    proc = subprocess.run([*launcher_cmd(2, ["--run-dir", str(run_dir)]), str(WORKER),
                           str(tmp_path), "abort"], env=worker_env(), capture_output=True,
                          text=True, timeout=120)
    err = proc.stderr
    assert proc.returncode == 128 + signal.SIGABRT, err
    assert "rank 1 crashed in native code (Aborted)" in err, err
    stack = err.split("crashed in native code", 1)[1]
    assert "line" in stack and "in die_natively" in stack.splitlines()[1], stack
    assert str(run_dir / "stacks" / "rank-1.txt") in stack
    assert (run_dir / "stacks" / "rank-1.txt").read_text().count("Fatal Python error") == 1
    assert "a crash inside native code" in err.split("scaletrain: error:", 1)[1]


def test_workers_helper_reruns_a_native_crash_once(tmp_path):
    """tests/workers.run_workers: a launch whose rank died in native code runs once more (with
    a warning naming the crash); a Python error does not."""
    script = tmp_path / "once.py"
    script.write_text("import os, sys\n"
                      "mark = sys.argv[1]\n"
                      "if not os.path.exists(mark):\n"
                      "    open(mark, 'w').close()\n"
                      "    os.abort()\n")
    with pytest.warns(RuntimeWarning, match="crashed in native code"):
        proc = run_workers(script, nproc=1, args=[tmp_path / "mark"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    raising = tmp_path / "raise.py"
    raising.write_text("raise SystemExit(5)\n")
    assert run_workers(raising, nproc=1, timeout=120).returncode == 1


def test_max_restarts_retries_the_group(tmp_path):
    proc = subprocess.run([*launcher_cmd(2, ["--max-restarts", "1"]), str(WORKER), str(tmp_path),
                           "flaky"], env=worker_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 0] attempt 1 ok" in proc.stdout and "[rank 1] attempt 1 ok" in proc.stdout
    assert len(list(tmp_path.glob("pid*.attempt0"))) == 2
    assert len(list(tmp_path.glob("pid*.attempt1"))) == 2


def test_sigterm_to_launcher_stops_workers(tmp_path):
    proc = subprocess.Popen([*launcher_cmd(2), str(WORKER), str(tmp_path), "sleep"],
                            env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("pid*.attempt0"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int(p.read_text()) for p in tmp_path.glob("pid*.attempt0")]
        assert len(pids) == 2, "workers did not start"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "received SIGTERM" in err
    survivors = [p for p in pids if _alive(p)]
    for pid in survivors:
        os.kill(pid, 9)
    assert not survivors
