"""The README's resumable example (examples/resumable_cnn.py), run as the README runs it: a USR1
sent while the program is still importing torch stops it cleanly (saved, exit 75, and it says so);
the next run resumes and its console counts the job's overall step; the report numbers the stop's
run as it numbers the runs. Also: a Checkpointer listens for stop signals from its creation."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from workers import REPO, worker_env

pytestmark = pytest.mark.multiproc

EXAMPLE = REPO / "examples" / "resumable_cnn.py"
SIZE = ["--samples", "1280", "--batch-size", "64"]        # 20 steps per epoch


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler of its own for ``signum`` (Linux: /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


def _usr1_while_starting(out, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """Start the example and send USR1 the moment its first lines set a handler: long before
    torch is imported and scaletrain.init() runs (importing torch alone takes a second or more)."""
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--out", str(out), "--epochs", "1", *SIZE],
                            env=worker_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _catches(proc.pid, signal.SIGUSR1) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        proc.send_signal(signal.SIGUSR1)
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    first = _usr1_while_starting(out)
    stop = json.loads((out / "checkpoints" / "stop.json").read_text()) if first.returncode == 75 else None
    second = subprocess.run([sys.executable, str(EXAMPLE), "--out", str(out), "--epochs", "2", *SIZE],
                            env=worker_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    report = subprocess.run([sys.executable, "-m", "scaletrain", "report", str(out)], env=worker_env(), cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    return first, stop, second, report


def test_usr1_before_the_handler_is_set_stops_cleanly_and_says_so(runs):
    first, stop, _, _ = runs
    assert first.returncode == 75, first.stdout + first.stderr            # not 138: killed by USR1
    assert "SIGUSR1 arrived while the program was starting; it saves and stops after a step" in first.stderr
    assert "Traceback" not in first.stderr
    assert stop is not None and stop["signal"] == "SIGUSR1" and stop["step"] >= 1, stop


def test_the_next_run_resumes_and_its_console_counts_the_overall_step(runs):
    _, stop, second, _ = runs
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"starting at step {stop['step']} of 40" in second.stdout
    shown = [line.split()[1] for line in second.stderr.splitlines() if line.startswith("step ")]
    # a line every 10 of this run's steps, numbered from where the job resumed, and the last step
    assert shown[0] == f"{stop['step'] + 10}/40" and shown[-1] == "40/40", shown


def test_the_report_names_the_stopped_run_in_the_runs_numbering(runs):
    _, stop, _, report = runs
    assert report.returncode == 0, report.stdout + report.stderr
    assert "runs: 2 (restarted 1x)" in report.stdout
    assert f"at step {stop['step']} (SIGUSR1, run 1 of 2)" in report.stdout, report.stdout
    assert "weighted by their steps: run 1 " in report.stdout and f"over {40 - stop['step']} steps" in report.stdout


PROGRAM = textwrap.dedent("""\
    import os, signal, sys
    import scaletrain
    from scaletrain.runtime import preempt
    scaletrain.init()
    if sys.argv[2] == "checkpointer":
        ckpt = scaletrain.Checkpointer(sys.argv[1])
    os.kill(os.getpid(), signal.SIGUSR1)      # after init, before any step
    print("recorded", preempt.requested(), flush=True)
    """)


@pytest.mark.parametrize("with_checkpointer", [True, False])
def test_a_checkpointer_listens_for_a_stop_from_its_creation(tmp_path, with_checkpointer):
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path / "ckpt"),
                           "checkpointer" if with_checkpointer else "none"],
                          env=worker_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    if with_checkpointer:       # recorded: the first step() would save and stop
        assert proc.returncode == 0 and "recorded time_limit" in proc.stdout, proc.stdout + proc.stderr
    else:                       # nothing would ever act on it: the default action, as documented
        assert proc.returncode == -signal.SIGUSR1, proc.stdout + proc.stderr
