"""The check before sbatch runs the job's own set-up lines for TensorFlow and Horovod plans on CSC's
clusters, here under stand-ins for the centre's modules: a ``module`` shell function as Lmod
exports it, whose ``load python-tensorflow`` / ``tensorflow/2.16`` puts a Python that finds
tensorflow first on PATH, and whose ``load python-pytorch`` / ``pytorch`` one that finds torch
and scaletrain but no tensorflow (CSC docs/apps/tensorflow.md and pytorch.md, 2026-11-27: two
modules; "The virtual environment needs to be created with the correct python module activated").

Each plan either passes the check as written (its Python has the framework) or is refused with
the fix, before anything is queued."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from helpers import plan_for
from scaletrain.envs import check
from scaletrain.errors import DistEnvError, PlanError

TF_MODULES = {"roihu": "python-tensorflow", "lumi": "tensorflow/2.16"}
TORCH_MODULES = {"roihu": "python-pytorch", "lumi": "pytorch"}


def _python(folder: Path, site: Path | None) -> Path:
    """``folder/python3``: this interpreter, with ``site`` first on its path."""
    folder.mkdir(parents=True, exist_ok=True)
    python = folder / "python3"
    path = f"PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}} " if site else ""
    python.write_text(f"#!/bin/bash\n{path}exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


def _package(site: Path, name: str) -> Path:
    (site / name).mkdir(parents=True, exist_ok=True)
    (site / name / "__init__.py").write_text("")
    return site


def _venv(root: Path, python_dir: Path) -> Path:
    """A finished venv (bin/activate, pyvenv.cfg) whose activate puts ``python_dir`` first."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "activate").write_text(f'export PATH="{python_dir}:$PATH"\n')
    (root / "pyvenv.cfg").write_text("include-system-site-packages = true\n")
    return root


@pytest.fixture
def centre(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The environment a login node of the centre hands the check, and the stand-ins' folders."""
    tf_bin = _python(tmp_path / "tf-module" / "bin", _package(tmp_path / "tf-site", "tensorflow"))
    torch_bin = _python(tmp_path / "torch-module" / "bin", None)   # this Python: torch, scaletrain
    loads = " ".join(f'{m}) PATH="{tf_bin.parent}:$PATH";;' for m in TF_MODULES.values())
    loads += " " + " ".join(f'{m}) PATH="{torch_bin.parent}:$PATH";;' for m in TORCH_MODULES.values())
    module = ('() { local cmd=$1; shift; case $cmd in purge|use) return 0;; load) for m in "$@"; do '
              f'case $m in {loads} *) echo "Lmod: the following module(s) are unknown: $m" >&2; return 1;; esac; '
              'done; export PATH;; esac; }')
    environ = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "BASH_FUNC_module%%": module}
    # the login node has the GPU nodes' CPU (Roihu's are Arm): the check runs
    monkeypatch.setattr(check, "this_arch", lambda machine=None: None)
    return {"environ": environ, "tf": tf_bin.parent, "torch": torch_bin.parent, "root": tmp_path}


@pytest.mark.parametrize("cluster", ["roihu", "lumi"])
def test_a_tensorflow_job_passes_on_the_centres_tensorflow_module(centre, cluster):
    plan = plan_for(cluster, nodes=2, launcher="tensorflow")
    assert f"module load {TF_MODULES[cluster]}" in check.probe_script(plan)
    assert check.check_job_python(plan, environ=centre["environ"]).not_checked is None


@pytest.mark.parametrize("cluster", ["roihu", "lumi"])
def test_a_tensorflow_venv_made_on_the_pytorch_module_is_refused_with_the_fix(centre, cluster):
    wrong = _venv(centre["root"] / "on-pytorch", centre["torch"])
    plan = plan_for(cluster, nodes=2, launcher="tensorflow", venv=str(wrong))
    with pytest.raises(DistEnvError) as err:
        check.check_job_python(plan, environ=centre["environ"])
    assert "cannot import tensorflow" in err.value.message
    assert f"scaletrain env create --cluster {cluster} --with tensorflow DIR" in err.value.hint
    # the venv env create --with tensorflow makes: on the TensorFlow module, which it sees
    right = _venv(centre["root"] / "on-tensorflow", centre["tf"])
    plan = plan_for(cluster, nodes=2, launcher="tensorflow", venv=str(right))
    assert check.check_job_python(plan, environ=centre["environ"]).not_checked is None


@pytest.mark.parametrize("cluster", ["roihu", "lumi"])
def test_a_horovod_program_runs_only_from_a_venv_that_has_horovod(centre, cluster, tmp_path):
    program = tmp_path / "pytorch_horovod.py"
    program.write_text("import horovod.torch as hvd\nimport torch\n")
    imports = ("horovod", "torch")
    with pytest.raises(PlanError, match="imports horovod"):   # CSC: "Horovod has been removed"
        plan_for(cluster, gpus=4, launcher="mpi", script=str(program), program_imports=imports)
    lacking = _venv(tmp_path / "no-hvd", centre["torch"])
    plan = plan_for(cluster, gpus=4, launcher="mpi", script=str(program), program_imports=imports,
                    venv=str(lacking), modules=(TORCH_MODULES[cluster],))
    with pytest.raises(DistEnvError, match="cannot import horovod"):
        check.check_job_python(plan, environ=centre["environ"])
    with_hvd = _python(tmp_path / "hvd-venv-bin", _package(tmp_path / "hvd-site", "horovod")).parent
    built = _venv(tmp_path / "hvd", with_hvd)
    plan = plan_for(cluster, gpus=4, launcher="mpi", script=str(program), program_imports=imports,
                    venv=str(built), modules=(TORCH_MODULES[cluster],))
    assert check.check_job_python(plan, environ=centre["environ"]).not_checked is None


def test_an_unknown_module_stops_the_check_with_its_own_words(centre):
    plan = plan_for("roihu", gpus=4, modules=("python-pytorch/9.9",))
    with pytest.raises(DistEnvError) as err:
        check.check_job_python(plan, environ=centre["environ"])
    assert "unknown: python-pytorch/9.9" in err.value.message
