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


def _fake(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(FAKE.format(log=log))
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
