"""Helpers shared by the test tiers: the CLI runner, a free port, and the launcher variables.

Import as ``from helpers import run_cli, free_port, LAUNCHER_VARS`` (tests/ is on sys.path:
pytest puts the root conftest's folder there, and tests/workers.py puts it on the workers').
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import pytest

# Every variable a launcher (torchrun, Slurm, Open MPI, MPICH/PMI, MVAPICH) or a user sets to
# place a process in a job. Tests and workers start from an environment without them, so a
# test run inside a Slurm job or a torchrun shell behaves as on a laptop.
LAUNCHER_PREFIXES: tuple[str, ...] = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL",
                                      "TORCHELASTIC_", "MV2_", "PALS_")
LAUNCHER_VARS: frozenset[str] = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
})


# Hides every GPU from a process started with these variables (CUDA, ROCm's runtime and HIP
# read them; so does scaletrain's own GPU count, before nvidia-smi or /dev/nvidiaN). A test that
# assumes a machine without GPUs starts its processes with them, so the suite means the same on
# a GPU workstation as here.
NO_GPUS: dict[str, str] = {"CUDA_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": "",
                           "HIP_VISIBLE_DEVICES": ""}


def is_launcher_var(name: str) -> bool:
    """True for a variable that places a process in a job (see LAUNCHER_VARS)."""
    return name in LAUNCHER_VARS or name.startswith(LAUNCHER_PREFIXES)


def without_launcher_vars(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``environ`` without the launcher variables."""
    return {k: v for k, v in environ.items() if not is_launcher_var(k)}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``scaletrain ARGV`` in this process: (exit code, stdout, stderr)."""
    from scaletrain.cli.main import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sigint_as_ctrl_c() -> None:
    """``preexec_fn`` for a child the test sends SIGINT: SIGINT back at its default, so Python
    installs its Ctrl-C handler. A suite started in the background from a script inherits
    SIGINT *ignored* (POSIX shells do that for background jobs), and a Python started with it
    ignored never raises KeyboardInterrupt: the test would wait out the child's own timeout."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def ctrl_c_handler():
    """In this process, SIGINT raises KeyboardInterrupt for the test, whatever was inherited."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (Linux /proc)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def deepspeed_attr(module: str, name: str) -> Any:
    """``module.name`` from DeepSpeed where it installs, else None (tests then check fields).

    DeepSpeed sets PYTORCH_NVML_BASED_CUDA_CHECK when first imported; the environment is put
    back as it was, so the hygiene fixture sees no leak.
    """
    import importlib
    import os

    saved = dict(os.environ)
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - not installed, or fails to import on this machine
        return None
    finally:
        os.environ.clear()
        os.environ.update(saved)


def plan_for(cluster: str, **kw: Any) -> Any:
    """``make_plan`` for a shipped cluster profile, with an account and a training script by default."""
    from scaletrain.clusters.profile import load_profile
    from scaletrain.plan.planner import make_plan
    from scaletrain.plan.request import JobRequest

    kw.setdefault("account", "project_1")
    kw.setdefault("script", "train.py")
    return make_plan(JobRequest(cluster=cluster, **kw), load_profile(cluster))


def render_for(cluster: str, **kw: Any) -> str:
    """The batch script ``plan_for`` gives."""
    from scaletrain.plan.render import render_script

    return render_script(plan_for(cluster, **kw))


def marker_checksums(marker: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """(algorithm, {file: checksum}) that a checkpoint's commit marker records."""
    for name in ("crc32c", "crc32"):
        if isinstance(marker.get(name), dict):
            return name, dict(marker[name])
    raise AssertionError(f"the marker records no checksums: {sorted(marker)}")


def reference_checksum(algorithm: str, data: bytes) -> str:
    """The checksum of ``data`` computed without scaletrain (zlib, or the crc32c package)."""
    import zlib

    if algorithm == "crc32":
        return f"{zlib.crc32(data):08x}"
    import crc32c

    return f"{crc32c.crc32c(data):08x}"


def reference_blocks(algorithm: str, data: bytes, block: int) -> str:
    """The per-block checksums of ``data`` as a commit marker spells them, without scaletrain."""
    pieces = [data[i:i + block] for i in range(0, len(data), block)] or [b""]
    return "".join(reference_checksum(algorithm, piece) for piece in pieces)


def seeded_linear(seed: int) -> Any:
    """A 4x3 ``torch.nn.Linear`` whose weights ``seed`` decides: a step's state, told apart."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3)


def save_steps(directory: Path, steps: tuple[int, ...] = (20, 30)) -> Path:
    """A checkpoint folder holding ``steps``: each ``seeded_linear(step)`` and the step as a value."""
    import scaletrain

    ckpt = scaletrain.Checkpointer(directory, keep=len(steps) + 1)
    for step in steps:
        ckpt.save(step, {"model": seeded_linear(step), "epoch": step})
    ckpt.close()
    return directory


def reseal(folder: Path, name: str, data: bytes | None = None) -> None:
    """Replace a checkpoint file with ``data`` (when given) and fix its size and checksums in the
    commit marker, as an attacker who knows the format would (scaletrain not used)."""
    import json

    if data is not None:
        (folder / name).write_bytes(data)
    data = (folder / name).read_bytes()
    marker = json.loads((folder / "COMMIT.json").read_text())
    marker["files"][name] = len(data)
    algorithm, _ = marker_checksums(marker)
    marker[algorithm][name] = reference_checksum(algorithm, data)
    if isinstance(marker.get("blocks"), dict):
        marker["blocks"][algorithm][name] = reference_blocks(algorithm, data, marker["blocks"]["bytes"])
    (folder / "COMMIT.json").write_text(json.dumps(marker))


# A stand-in for a centre module's ``python3`` (one whose own site-packages hold torch), for the
# tests of ``env create`` and of jobs that use the venv it makes. Where this interpreter is a
# system Python, that is this interpreter. Where it is itself a venv (how most users run the
# suite), ``python -m venv --system-site-packages`` from it would see the *base* Python's
# packages, not this venv's torch: the stand-in then makes the venv and adds this venv's
# site-packages behind the new venv's own, which is what a module's site-packages would be.
_MODULE_PYTHON = """#!{python}
# stand-in for a centre module's python3 (tests/helpers.py module_python)
import os, subprocess, sys
args = sys.argv[1:]
if args[:2] != ["-m", "venv"]:
    os.execv(sys.executable, [sys.executable, *args])
code = subprocess.call([sys.executable, *args])
target = args[-1]
if code == 0 and "--system-site-packages" in args:
    lib = os.path.join(target, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    with open(os.path.join(lib, "_module_standin.pth"), "w") as f:
        f.write("\\n".join({paths!r}) + "\\n")
sys.exit(code)
"""


def in_venv() -> bool:
    """True when the interpreter running the tests is a virtual environment's."""
    return sys.prefix != sys.base_prefix


def module_python(folder: Path) -> Path:
    """``folder/bin/python3``: a module's Python with torch (see ``_MODULE_PYTHON``), made here."""
    import sysconfig

    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    python = bin_dir / "python3"
    if not in_venv():
        python.symlink_to(sys.executable)
        return python
    paths = list(dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]))
    python.write_text(_MODULE_PYTHON.format(python=sys.executable, paths=paths))
    python.chmod(0o755)
    return python


def framework_python(name: str) -> Path:
    """The interpreter of the venv ``scripts/frameworks_env.sh`` built for ``name`` (horovod,
    tensorflow); the test skips with the script's reason (not built, or why it failed) otherwise."""
    import subprocess
    import sys

    if os.environ.get("SCALETRAIN_TEST_BUILDS_PENDING") == "pending":
        # scripts/test.sh runs the tests that need its builds (marked `built`) after them
        pytest.fail(f"this test needs the {name} venv, which scripts/test.sh builds while the unmarked "
                    "tests run: mark it @pytest.mark.built")
    script = Path(__file__).resolve().parent.parent / "scripts" / "frameworks_env.sh"
    proc = subprocess.run(["bash", str(script), "--find", name], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable})
    if proc.returncode != 0:
        why = proc.stderr.strip() or f"no {name} venv (scripts/frameworks_env.sh {name})"
        # scripts/test.sh built it just before: a missing venv there is a failure, not a skip
        if name in os.environ.get("FRAMEWORKS_REQUIRED", "").split():
            pytest.fail(f"{name} was built for this run but is missing: {why}")
        pytest.skip(why)
    return Path(proc.stdout.strip()) / "bin" / "python"


def trained_alike(results: list[dict[str, Any]], reference: list[float], key: str, *, rtol: float) -> None:
    """Every worker's ``key`` (its flattened trained parameters) is the same, and equals one
    process's ``reference`` within ``rtol`` (the sums of a gradient's parts run in another order)."""
    import numpy as np

    first = np.asarray(results[0][key])
    assert first.size == len(reference) > 0
    for other in results[1:]:
        np.testing.assert_allclose(other[key], first, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(first, reference, rtol=rtol, atol=rtol / 10)
