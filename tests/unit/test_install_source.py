"""scripts/install.sh on a CPU-only machine: torch's CPU wheel, not the public index's CUDA build.

The public index's ``torch==2.13.0`` is the CUDA build (it pulls nvidia-* packages). These tests build two
local indexes - one that offers only that CUDA-shaped torch, one that plays PyTorch's CPU index - and let
pip itself resolve the constraint with the arguments ``scripts/torch_index.py`` chooses. No network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHOOSER = REPO / "scripts" / "torch_index.py"
CONSTRAINTS = REPO / "constraints" / "cpu.txt"


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal valid pure-Python wheel (enough for pip's resolver)."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                      *[f"Requires-Dist: {r}" for r in requires]]) + "\n"
    wheel = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    project = folder / name
    project.mkdir(parents=True, exist_ok=True)
    path = project / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{dist}.dist-info/METADATA", meta)
        zf.writestr(f"{dist}.dist-info/WHEEL", wheel)
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    links = "".join(f'<a href="{p.name}">{p.name}</a>\n' for p in sorted(project.glob("*.whl")))
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


def _pip_env(index_url: str) -> dict[str, str]:
    """The environment of a laptop whose pip knows only ``index_url`` (no machine configuration)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=index_url, PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_CACHE_DIR="1")
    return env


def _choose(env: dict[str, str]) -> tuple[list[str], str]:
    done = subprocess.run([sys.executable, str(CHOOSER)], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split(), done.stderr


def _resolve(env: dict[str, str], extra: list[str], tmp: Path) -> dict[str, str]:
    """What pip would install for the CPU constraint: {name: version}."""
    report = tmp / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         "--report", str(report), "-c", str(CONSTRAINTS), *extra, "torch"],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    items = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"]: i["metadata"]["version"] for i in items}


@pytest.fixture()
def indexes(tmp_path: Path) -> tuple[Path, Path]:
    cuda, cpu = tmp_path / "public", tmp_path / "cpu"
    _wheel(cuda, "nvidia-cublas-cu12", "12.9.1")
    _wheel(cuda, "torch", "2.13.0", requires=("nvidia-cublas-cu12==12.9.1",))
    _wheel(cpu, "torch", "2.13.0+cpu")
    return cuda, cpu


def test_without_the_cpu_index_pip_takes_the_cuda_build(indexes, tmp_path):
    """The problem as a user meets it: the constraint alone resolves to the CUDA-shaped wheel."""
    cuda, _ = indexes
    chosen = _resolve(_pip_env(cuda.as_uri()), [], tmp_path)
    assert chosen["torch"] == "2.13.0" and "nvidia-cublas-cu12" in chosen


def test_a_reachable_cpu_index_gives_the_cpu_wheel_and_no_cuda_package(indexes, tmp_path):
    cuda, cpu = indexes
    env = _pip_env(cuda.as_uri()) | {"SCALETRAIN_TORCH_CPU_INDEX": cpu.as_uri()}
    extra, said = _choose(env)
    assert extra == ["--extra-index-url", cpu.as_uri()]
    assert "CPU wheel" in said
    chosen = _resolve(env, extra, tmp_path)
    assert chosen == {"torch": "2.13.0+cpu"}


def test_an_unreachable_index_keeps_the_machine_configuration_and_says_so(tmp_path):
    env = _pip_env((tmp_path / "none").as_uri()) | {"SCALETRAIN_TORCH_CPU_INDEX": (tmp_path / "gone").as_uri()}
    extra, said = _choose(env)
    assert extra == []
    assert "not reachable" in said and "pip's own configuration" in said


def test_a_malformed_index_value_is_refused_in_one_line(tmp_path):
    env = _pip_env((tmp_path / "none").as_uri()) | {"SCALETRAIN_TORCH_CPU_INDEX": "$(touch x)"}
    extra, said = _choose(env)
    assert extra == [] and said.count("\n") == 1 and "not an http(s) or file URL" in said


def test_install_sh_uses_the_chooser_only_on_cpu_machines_without_torch():
    text = (REPO / "scripts" / "install.sh").read_text()
    cpu_branch = text.split("args+=(-c constraints/cpu.txt)", 1)[1].split("\nfi", 1)[0]
    assert "scripts/torch_index.py" in cpu_branch and 'args+=("${extra[@]}")' in cpu_branch


def _chooser(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHOOSER)], env=env, capture_output=True, text=True, timeout=300)


def test_no_cpu_build_anywhere_stops_with_the_choice_instead_of_the_cuda_build(indexes, tmp_path):
    """The CPU index unreachable and pip's own configuration offering only the CUDA build: nothing is
    chosen, one line names both ways on, and the exit status stops scripts/install.sh."""
    cuda, _ = indexes
    env = _pip_env(cuda.as_uri()) | {"SCALETRAIN_TORCH_CPU_INDEX": (tmp_path / "gone").as_uri()}
    done = _chooser(env)
    assert done.returncode == 3 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "CUDA build" in done.stderr
    assert "SCALETRAIN_TORCH_CPU_INDEX=" in done.stderr and "SCALETRAIN_TORCH_CUDA_OK=1" in done.stderr
    # asked for: the CUDA build is taken, and said
    accepted = _chooser(env | {"SCALETRAIN_TORCH_CUDA_OK": "1"})
    assert accepted.returncode == 0 and "the CUDA build, as asked" in accepted.stderr


def test_a_cpu_build_in_pips_own_configuration_is_used_when_the_index_is_unreachable(indexes, tmp_path):
    _, cpu = indexes
    env = _pip_env(cpu.as_uri()) | {"SCALETRAIN_TORCH_CPU_INDEX": (tmp_path / "gone").as_uri()}
    done = _chooser(env)
    assert done.returncode == 0 and done.stdout == ""
    assert "torch 2.13.0+cpu from pip's own configuration (a CPU build)" in done.stderr


def test_install_sh_stops_on_the_cuda_build_and_installs_nothing(indexes, tmp_path):
    """scripts/install.sh itself: the chooser's stop ends it before pip installs anything."""
    cuda, _ = indexes
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=120)   # a Python without torch
    env = _pip_env(cuda.as_uri()) | {"SCALETRAIN_TORCH_CPU_INDEX": (tmp_path / "gone").as_uri(),
                                      "PYTHON": str(venv / "bin" / "python")}
    done = subprocess.run(["bash", str(REPO / "scripts" / "install.sh")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 3 and "CUDA build" in done.stderr


def test_install_sh_on_an_externally_managed_python_says_to_make_a_venv(tmp_path):
    """Debian's and Ubuntu's system Python (PEP 668): one line naming the venv to make, exit 2,
    before pip is asked anything."""
    import sysconfig

    candidates = [p for p in ("/usr/bin/python3",) if Path(p).is_file()]
    marked = [p for p in candidates if subprocess.run(
        [p, "-c", "import os, sys, sysconfig; sys.exit(not (sys.prefix == sys.base_prefix and os.path.isfile("
         "os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED'))))"], timeout=60).returncode == 0]
    if not marked:
        pytest.skip(f"no externally managed Python here (PEP 668; {sysconfig.get_path('stdlib')})")
    done = subprocess.run(["bash", str(REPO / "scripts" / "install.sh")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHON": marked[0]})
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "python3 -m venv" in done.stderr and "PEP 668" in done.stderr
