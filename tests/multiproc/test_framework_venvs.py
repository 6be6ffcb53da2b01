"""scripts/frameworks_env.sh on a machine that has never run it: the framework venvs build from what
the script itself installs, from inside a user's venv, and after a failure once its cause is gone.

Horovod's real build is minutes of C++ (scripts/test.sh does it, and test_frameworks_real.py trains
with it); here a stand-in source package of the same name and layout goes through the same steps
(build requirements, download replaced by HOROVOD_SDIST, the C++17 patch, pip's build without build
isolation against the environment's torch, the import check). Like Horovod's, it has a setup.py and
no pyproject.toml, so pip builds it through setuptools' PEP 517 backend, which needs a setuptools
with bdist_wheel (or the `wheel` package): what a fresh Python lacks.

The base Python of each test is a fresh venv (only what `python -m venv` puts there) with a
stand-in torch package, and every cache is empty. The build requirements come from the package
index, as in CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from workers import REPO

pytestmark = pytest.mark.multiproc
SCRIPT = REPO / "scripts" / "frameworks_env.sh"
VERSION = "0.28.1"

# Horovod's build imports torch (its extension is compiled against it); the stand-in records which
# torch it found, so a test can tell the user's venv's from the base interpreter's
SETUP_PY = """
import os, torch
from setuptools import setup
flag = os.environ.get("STANDIN_FAIL_IF_EXISTS")
if flag and os.path.exists(flag):
    raise SystemExit("stand-in build failed: " + flag + " exists")
with open(os.path.join("horovod", "torch", "built_against.py"), "w") as f:
    f.write("TORCH_FILE = %r\\n" % torch.__file__)
setup(name="horovod", version="{version}", packages=["horovod", "horovod.torch"])
"""
TORCH_INIT = "def mpi_built():\n    return True\n\n\ndef gloo_built():\n    return True\n"


def _sdist(folder: Path) -> Path:
    """A source package shaped like PyPI's horovod-0.28.1.tar.gz (the lines the build patches too)."""
    root = folder / f"horovod-{VERSION}"
    (root / "horovod" / "torch").mkdir(parents=True)
    (root / "setup.py").write_text(SETUP_PY.format(version=VERSION))
    (root / "CMakeLists.txt").write_text("set(CMAKE_CXX_STANDARD 14)\n")
    (root / "horovod" / "torch" / "CMakeLists.txt").write_text("set(CMAKE_CXX_STANDARD 14)\n")
    (root / "horovod" / "__init__.py").write_text("")
    (root / "horovod" / "torch" / "__init__.py").write_text(TORCH_INIT)
    path = folder / f"horovod-{VERSION}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    return path


def _base_python() -> str:
    """The interpreter a fresh venv is made from (this Python's base when it runs in a venv)."""
    return getattr(sys, "_base_executable", sys.executable) if sys.prefix != sys.base_prefix else sys.executable


@pytest.fixture()
def user_venv(tmp_path: Path) -> Path:
    """A user's venv as a fresh machine makes it, with a stand-in torch as its only package."""
    venv = tmp_path / "user-venv"
    subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(site) / "torch").mkdir()
    (Path(site) / "torch" / "__init__.py").write_text("__version__ = '0.0.0+stand-in'\n")
    # the state that broke the first cold run: no `wheel` in the Python that runs the script
    assert subprocess.run([str(py), "-c", "import wheel"], capture_output=True, timeout=60).returncode != 0
    return venv


def _tools(folder: Path) -> Path:
    """cmake, c++ and mpicc stand-ins: the machine 'can build' Horovod (the stand-in needs none)."""
    bin_dir = folder / "tools"
    bin_dir.mkdir()
    for tool in ("cmake", "c++", "mpicc"):
        (bin_dir / tool).write_text("#!/bin/sh\necho stand-in 1.0\n")
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def _frameworks(venv: Path, tmp_path: Path, *args: str, extra: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=str(venv / "bin" / "python"), SCALETRAIN_CI_CACHE=str(tmp_path / "cache"),
               PIP_CACHE_DIR=str(tmp_path / "pip-cache"), HOROVOD_SDIST=str(_sdist_path(tmp_path)),
               PATH=f"{tmp_path / 'tools'}:{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}", **(extra or {}))
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env)


def _sdist_path(tmp_path: Path) -> Path:
    return tmp_path / "sdist" / f"horovod-{VERSION}.tar.gz"


@pytest.fixture()
def machine(tmp_path: Path, user_venv: Path) -> Path:
    (tmp_path / "sdist").mkdir()
    _sdist(tmp_path / "sdist")
    _tools(tmp_path)
    return user_venv


def _built(tmp_path: Path, venv: Path) -> Path:
    found = _frameworks(venv, tmp_path, "--find", "horovod")
    assert found.returncode == 0, found.stderr
    return Path(found.stdout.strip()) / "bin" / "python"


def test_horovod_builds_from_a_python_without_wheel_and_an_empty_cache(tmp_path: Path, machine: Path) -> None:
    done = _frameworks(machine, tmp_path, "horovod")
    assert done.returncode == 0, done.stderr
    py = _built(tmp_path, machine)
    check = subprocess.run([str(py), "-c", "import horovod.torch as h; assert h.mpi_built() and h.gloo_built()"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    # the build requirements went into the framework's venv, not into the user's
    assert subprocess.run([str(machine / "bin" / "python"), "-c", "import wheel"], capture_output=True,
                          timeout=60).returncode != 0


def test_a_framework_venv_made_from_a_venv_sees_that_venvs_torch(tmp_path: Path, machine: Path) -> None:
    done = _frameworks(machine, tmp_path, "horovod")
    assert done.returncode == 0, done.stderr
    py = _built(tmp_path, machine)
    seen = subprocess.run([str(py), "-c", "import torch, horovod.torch.built_against as b; "
                           "print(torch.__version__); print(torch.__file__); print(b.TORCH_FILE)"],
                          capture_output=True, text=True, timeout=60)
    assert seen.returncode == 0, seen.stderr
    version, runtime_file, build_file = seen.stdout.split()
    assert version == "0.0.0+stand-in"
    assert runtime_file.startswith(str(machine)) and build_file.startswith(str(machine))


def test_a_failed_build_is_built_again_once_its_cause_is_gone(tmp_path: Path, machine: Path) -> None:
    flag = tmp_path / "cause"
    flag.write_text("")
    first = _frameworks(machine, tmp_path, "horovod", extra={"STANDIN_FAIL_IF_EXISTS": str(flag)})
    assert first.returncode != 0
    assert "could not be built" in first.stderr
    assert list((tmp_path / "cache").glob("frameworks-horovod-*.failed"))
    flag.unlink()   # the cause is gone; nothing else changed (same key)
    second = _frameworks(machine, tmp_path, "horovod", extra={"STANDIN_FAIL_IF_EXISTS": str(flag)})
    assert second.returncode == 0, second.stderr
    assert "building again" in second.stderr
    assert _built(tmp_path, machine).is_file()
    assert not list((tmp_path / "cache").glob("frameworks-horovod-*.failed"))
