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
