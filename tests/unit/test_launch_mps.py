"""Tier 1: the MPS daemon for --procs-per-gpu, with a fake `nvidia-cuda-mps-control` on PATH.

The fake records each call (its arguments, stdin and CUDA_MPS_PIPE_DIRECTORY) so the test can
check: started with -d in our own pipe directory, workers told that directory, stopped with
"quit" afterwards; a daemon that is already running is used and left alone.
"""

from __future__ import annotations

import os
import stat

from scaletrain.launch.mps import mps_daemon

FAKE = """#!/bin/sh
input=""
if [ "$#" -eq 0 ]; then input=$(cat); fi
echo "args=$* input=$input pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "{log}"
"""


def _fake(tmp_path, script=FAKE):
    """A fake control command on PATH (its {log} a file beside it); the PATH and the log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(script.format(log=log))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin"}, log


def test_starts_in_own_directory_and_stops_what_it_started(tmp_path, capsys):
    env, log = _fake(tmp_path)
    with mps_daemon(True, env) as extra:
        pipe = extra["CUDA_MPS_PIPE_DIRECTORY"]
        assert os.path.isdir(pipe) and "CUDA_MPS_LOG_DIRECTORY" in extra
        calls = log.read_text().splitlines()
        assert calls == [f"args=-d input= pipe={pipe}"]
    calls = log.read_text().splitlines()
    assert calls[1] == f"args= input=quit pipe={pipe}"
    assert not os.path.exists(pipe)  # our temporary directories are removed
    assert "started the MPS daemon" in capsys.readouterr().err


def test_running_daemon_is_used_and_left_alone(tmp_path):
    env, log = _fake(tmp_path)
    pipe = tmp_path / "mps"
    pipe.mkdir()
    (pipe / "control").write_text("")  # the daemon's control socket
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
    with mps_daemon(True, env) as extra:
        assert extra == {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    assert not log.exists()  # neither started nor stopped


def test_nothing_without_the_binary_or_when_not_asked(tmp_path):
    with mps_daemon(True, {"PATH": str(tmp_path)}) as extra:
        assert extra == {}
    env, log = _fake(tmp_path)
    with mps_daemon(False, env) as extra:
        assert extra == {}
    assert not log.exists()


# A daemon as `quit` meets it when a client is still alive: `-d` leaves a daemon behind (in
# the background, its output closed, as the real one) that ignores SIGTERM, and `quit` waits
# for it for ever. The daemon's PID goes to a file so the test can look for it afterwards.
STUCK = """#!/bin/sh
if [ "$1" = "-d" ]; then
  "$0" serve </dev/null >/dev/null 2>&1 &
  exit 0
fi
if [ "$1" = "serve" ]; then
  echo $$ > "{log}"
  trap '' TERM
  while :; do sleep 0.1; done
fi
read command
while :; do sleep 0.1; done
"""

ENTER_AND_LEAVE = """
import sys
from scaletrain.launch.mps import mps_daemon
env = {"PATH": sys.argv[1]}
with mps_daemon(True, env, grace_s=1.0) as extra:
    assert "CUDA_MPS_PIPE_DIRECTORY" in extra
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_daemon_that_never_quits_is_stopped_after_the_grace_period(tmp_path):
    """The launcher of `run --procs-per-gpu 2` trained and never ended: it waited on `quit`.
    Now the block ends (here within a 1 s grace period, bounded by the subprocess's timeout
    only so that a regression fails instead of hanging) and no daemon is left."""
    import subprocess
    import sys
    import time

    path, pidfile = _fake(tmp_path, STUCK)   # the daemon writes its PID where the log would be
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    env.pop("CUDA_MPS_PIPE_DIRECTORY", None)
    proc = subprocess.Popen([sys.executable, "-c", ENTER_AND_LEAVE, path["PATH"]],
                            env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        if pidfile.exists():
            daemon = int(pidfile.read_text())
            if _alive(daemon):  # the old code left it: do not leak it into other tests
                os.kill(daemon, 9)
    assert proc.returncode == 0, err
    assert "started the MPS daemon" in err
    assert "the MPS daemon did not quit within 1 s; stopped it" in err
    daemon = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(daemon) and time.monotonic() < deadline:   # init reaps it
        time.sleep(0.05)
    assert not _alive(daemon)
