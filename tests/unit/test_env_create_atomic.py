"""``env create`` killed part-way leaves nothing under the target's name (issue 39, item 6).

It built in place: a kill left a venv without scaletrain, a rerun said only "exists and is not
empty" and ``--venv`` accepted the folder without a word. Now the build happens in a hidden
partial folder moved into place when complete; a rerun removes the dead build and finishes,
and ``--venv`` refuses a folder that is not a finished environment.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import module_python, run_cli

from scaletrain.envs.finished import ENV_MARKER, STAMP, finished_env

_CLI = "from scaletrain.cli.main import main; raise SystemExit(main())"


@pytest.fixture
def standin(tmp_path: Path, monkeypatch) -> Path:
    """A profile whose "module" is a Python with torch (helpers.module_python), without modules to load."""
    profile = tmp_path / "standin.toml"
    python = module_python(tmp_path / "module")   # a Python with torch, also when the suite runs in a venv
    profile.write_text(f'name = "standin"\npython = "{python}"\ngpus_per_node = 2\n'
                       'cores_per_node = 4\nmem_per_node_gb = 8\naccount_required = false\n'
                       '[partitions.p]\ndefault = true\n')
    monkeypatch.setenv("PIP_NO_INDEX", "1")           # the optional crc32c: no index, fail fast
    return profile


def _partials(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.partial-*"))


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_a_build_killed_part_way_leaves_no_environment_and_a_rerun_finishes(standin, tmp_path, capsys):
    target = tmp_path / "st-env"
    child = subprocess.Popen([sys.executable, "-c", _CLI, "env", "create", "--profile", str(standin),
                              str(target)], start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        # kill it (and its bash) once the venv exists but before scaletrain is copied and checked
        for _ in range(6000):
            if any((p / "bin" / "python").exists() for p in _partials(target)) or child.poll() is not None:
                break
            time.sleep(0.01)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert not os.path.lexists(target)
    (partial,) = _partials(target)
    assert "did not finish" in (finished_env(partial) or "")

    code, out, err = run_cli(capsys, "env", "create", "--profile", str(standin), str(target))
    assert code == 0, err
    assert f"removed {partial}: a build of this environment that was stopped part-way" in err
    assert out.strip() == f"--venv {target}" and _partials(target) == []
    assert finished_env(target) is None and (target / ENV_MARKER).is_file()
    assert not (target / STAMP).exists()
    activate = (target / "bin" / "activate").read_text()
    assert str(target) in activate and ".partial-" not in activate
    done = subprocess.run([str(target / "bin" / "python"), "-c", "import scaletrain; print(scaletrain.__file__)"],
                          capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                               if k != "PYTHONPATH"}, timeout=120)
    assert done.stdout.startswith(str(target)), done.stderr

    code, out, err = run_cli(capsys, "env", "create", "--profile", str(standin), str(target))
    assert code == 0 and "already an environment env create finished" in err


@pytest.mark.parametrize("make, words", [
    (lambda d: (d / ".scaletrain-building.json").write_text("{}"), "did not finish"),
    (lambda d: (d / "lib").mkdir(), "has no bin/python: not a Python environment"),
])
def test_venv_refuses_a_folder_that_is_not_a_finished_environment(capsys, tmp_path, make, words):
    folder = tmp_path / "env"
    (folder / "bin").mkdir(parents=True)
    if "did not" in words:
        (folder / "bin" / "python").symlink_to(sys.executable)
    make(folder)
    code, out, err = run_cli(capsys, "plan", "--cluster", "roihu", "--gpus", "4", "--account", "project_1",
                             "--venv", str(folder), "--", "train.py")
    assert code == 2 and out == "" and f"--venv: {folder} " in err and words in err


def test_venv_of_the_cluster_not_here_is_left_to_the_job(capsys):
    code, out, err = run_cli(capsys, "plan", "--cluster", "roihu", "--gpus", "4", "--account", "project_1",
                             "--venv", "/nonexistent-site/proj/env", "--", "train.py")
    assert code == 0 and "/nonexistent-site/proj/env/bin/activate" in out
