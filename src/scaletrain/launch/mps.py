"""NVIDIA Multi-Process Service for ``--procs-per-gpu``: several ranks sharing one GPU.

The seeds' recipe (Alliance Canada, "several replicas on one GPU") starts the MPS control
daemon before the ranks and points them at its pipe directory. We do the same, but only
stop a daemon we started: one that was already running (system-wide, or the user's own in
``CUDA_MPS_PIPE_DIRECTORY``) is used and left alone. Without the binary (a CPU machine, or
a GPU machine without MPS) the ranks simply time-share the device.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

MPS_CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # MPS's own default


def _daemon_running(pipe_dir: str) -> bool:
    return os.path.exists(os.path.join(pipe_dir, "control"))


@contextmanager
def mps_daemon(enabled: bool, environ: Mapping[str, str] | None = None) -> Iterator[dict[str, str]]:
    """Ensure an MPS daemon runs while the block runs; yields variables the workers need."""
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
    started = subprocess.run([exe, "-d"], env=daemon_env, capture_output=True, text=True)
    if started.returncode != 0:
        print(f"scaletrain: could not start the MPS daemon ({started.stderr.strip() or 'no output'});"
              " ranks will time-share the GPU", file=sys.stderr)
        if own_tmp:
            shutil.rmtree(own_tmp, ignore_errors=True)
        yield {}
        return
    print(f"scaletrain: started the MPS daemon (pipe directory {pipe_dir})", file=sys.stderr)
    try:
        yield extra
    finally:
        subprocess.run([exe], input="quit\n", env=daemon_env, capture_output=True, text=True)
        if own_tmp:
            shutil.rmtree(own_tmp, ignore_errors=True)
