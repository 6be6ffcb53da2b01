"""NVIDIA Multi-Process Service for ``--procs-per-gpu``: several ranks sharing one GPU.

The seeds' recipe (Alliance Canada, "several replicas on one GPU") starts the MPS control
daemon before the ranks and points them at its pipe directory. We do the same, but only
stop a daemon we started: one that was already running (system-wide, or the user's own in
``CUDA_MPS_PIPE_DIRECTORY``) is used and left alone. Without the binary (a CPU machine, or
a GPU machine without MPS) the ranks simply time-share the device.

Stopping is bounded. ``quit`` asks the daemon to end once its servers and *clients* are gone,
so a client still alive (a worker's child that kept CUDA open, killed only after this block by
the launcher's reaper) makes ``quit`` wait for ever; so can a daemon that holds the pipes of
the command that started it. So no call here reads a pipe (output goes to a file), each has
a time limit, and what is left of our daemon after the grace period (its processes carry our
pipe directory) is stopped with SIGTERM, then SIGKILL, and reaped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from scaletrain.launch.reaper import stop_processes
from scaletrain.launch.rundir import environ_of

MPS_CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # MPS's own default
GRACE_S = 15.0   # how long a daemon we started may take to quit (the launcher passes its own)
_START_S = 30.0  # `-d` forks the daemon and returns at once; this only bounds a broken one
_KILL_S = 2.0    # after the grace period: SIGTERM, this long, SIGKILL
_POLL_S = 0.05
_NAME = MPS_CONTROL[:15]  # /proc's comm: the control daemon and its nvidia-cuda-mps-server


def _daemon_running(pipe_dir: str) -> bool:
    return os.path.exists(os.path.join(pipe_dir, "control"))


def daemon_processes(pipe_dir: str) -> set[int]:
    """The MPS control daemon and servers serving ``pipe_dir`` (from /proc; empty without it)."""
    marker = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    found: set[int] = set()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
                if not fh.read().strip().startswith(_NAME):
                    continue
            if marker in environ_of(pid):   # bounded, and waits out an exec in progress
                found.add(pid)
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _call(cmd: list[str], env: Mapping[str, str], stdin: str, timeout_s: float) -> tuple[int | None, str]:
    """Run ``cmd`` in a session of its own with ``stdin``, its output into a file, for at most
    ``timeout_s``: (exit status or None on time-out, its output)."""
    with tempfile.TemporaryFile("w+b") as out:
        proc = subprocess.Popen(cmd, env=dict(env), stdin=subprocess.PIPE, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            assert proc.stdin is not None
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        except OSError:  # it exited without reading
            pass
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            try:
                os.killpg(proc.pid, 9)  # the command and anything it started in its session
            except OSError:
                pass
            proc.wait()
        out.seek(0)
        return code, out.read().decode(errors="replace").strip()


def stop_daemon(exe: str, env: Mapping[str, str], pipe_dir: str, grace_s: float) -> set[int]:
    """Ask the daemon serving ``pipe_dir`` to quit; what is left after ``grace_s`` is stopped.
    Returns the PIDs that had to be stopped (empty when it quit by itself)."""
    deadline = time.monotonic() + grace_s
    ours = daemon_processes(pipe_dir)
    _call([exe], env, "quit\n", grace_s)
    left = daemon_processes(pipe_dir)
    while left and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        left = daemon_processes(pipe_dir)
    if left:
        stop_processes(left, _KILL_S)
    for pid in ours:  # under the launcher (a subreaper) the daemon is our child: no zombie left
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass
    return left


@contextmanager
def mps_daemon(enabled: bool, environ: Mapping[str, str] | None = None, *,
               grace_s: float = GRACE_S) -> Iterator[dict[str, str]]:
    """Ensure an MPS daemon runs while the block runs; yields variables the workers need.
    A daemon started here is gone within ``grace_s`` seconds (and a little) of the block's end."""
    env = dict(os.environ if environ is None else environ)
    exe = shutil.which(MPS_CONTROL, path=env.get("PATH"))
    if not enabled or exe is None:
        yield {}
        return
    pipe_dir = env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR
    if _daemon_running(pipe_dir):
        yield {"CUDA_MPS_PIPE_DIRECTORY": pipe_dir} if "CUDA_MPS_PIPE_DIRECTORY" in env else {}
        return

    own_tmp = None
    if "CUDA_MPS_PIPE_DIRECTORY" not in env:
        # Our own directories, so that we never collide with another user's daemon.
        own_tmp = tempfile.mkdtemp(prefix="scaletrain_mps_")
        pipe_dir = os.path.join(own_tmp, "pipe")
        os.makedirs(pipe_dir)
    log_dir = env.get("CUDA_MPS_LOG_DIRECTORY") or os.path.join(own_tmp or pipe_dir, "log")
    os.makedirs(log_dir, exist_ok=True)
    extra = {"CUDA_MPS_PIPE_DIRECTORY": pipe_dir, "CUDA_MPS_LOG_DIRECTORY": log_dir}
    daemon_env = {**env, **extra}
    try:
        code, output = _call([exe, "-d"], daemon_env, "", _START_S)
        if code != 0:
            why = output or (f"no answer in {_START_S:g} s" if code is None else "no output")
            print(f"scaletrain: could not start the MPS daemon ({why}); ranks will time-share "
                  "the GPU", file=sys.stderr)
            stop_processes(daemon_processes(pipe_dir), _KILL_S)  # whatever a broken start left
            yield {}
            return
        print(f"scaletrain: started the MPS daemon (pipe directory {pipe_dir})", file=sys.stderr)
        try:
            yield extra
        finally:
            stopped = stop_daemon(exe, daemon_env, pipe_dir, grace_s)
            if stopped:
                print(f"scaletrain: the MPS daemon did not quit within {grace_s:g} s; stopped it "
                      f"(PIDs {', '.join(map(str, sorted(stopped)))})", file=sys.stderr)
    finally:
        if own_tmp:
            shutil.rmtree(own_tmp, ignore_errors=True)
