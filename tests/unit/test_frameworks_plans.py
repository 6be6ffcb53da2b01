"""Plans for the guides' Horovod and TensorFlow programs on each live centre, and the pieces the
check before sbatch reads: the program's imports, the --venv folder, the launcher's package.

Centres' pages (centre-docs, checked 2026-11-27): CSC docs/apps/pytorch.md "17.11.2023 PyTorch
2.1 added to Puhti, Mahti and LUMI. Horovod has been removed, we recommend using PyTorch DDP";
CSC docs/apps/tensorflow.md "module load python-tensorflow" (Roihu-GPU), "module use
/appl/local/csc/modulefiles/ ... module load tensorflow" (LUMI); Alliance TensorFlow page
(ualberta-rcg mirror) "In some cases, other modules may be required (e.g. CUDA)" and the GPU job
script's "module load cuda cudnn".
"""

from __future__ import annotations

import dataclasses
import urllib.error
import urllib.request

import pytest

from helpers import plan_for, render_for
from scaletrain.envs.imports import ProgramImports
from scaletrain.errors import DistEnvError, PlanError, UsageError
from scaletrain.plan.summary import notes

HOROVOD_PROGRAM = "import argparse\nimport horovod.torch as hvd\nimport torch\n"


@pytest.fixture
def hvd_program(tmp_path):
    path = tmp_path / "pytorch_horovod.py"
    path.write_text(HOROVOD_PROGRAM)
    return path


# ------------------------------------------------------------------------------ program imports

def test_program_imports_are_the_third_party_ones_it_cannot_run_without(tmp_path):
    """Needed: what runs whatever happens; optional: a function's, a branch's, a try's that catches
    ImportError (named, never refused, by the check before sbatch)."""
    from scaletrain.envs.imports import program_imports

    (tmp_path / "mymodel.py").write_text("")
    (tmp_path / "utils").mkdir()
    program = tmp_path / "train.py"
    program.write_text(
        "import os, sys, json\nimport numpy as np\nfrom torch.utils.data import DataLoader\n"
        "import horovod.torch as hvd\nimport mymodel\nfrom utils import helpers\nfrom . import sibling\n"
        "from __future__ import annotations\n"
        "try:\n    import wandb\nexcept ImportError:\n    wandb = None\n"
        "try:\n    import apex\nexcept OSError:\n    pass\n"   # a failed import is not caught: needed
        "try:\n    import triton\nexcept (ModuleNotFoundError, OSError):\n    pass\n"
        "def main():\n    import tensorflow as tf\n")
    read = program_imports(str(program))
    assert read.needed == ("apex", "horovod", "numpy", "torch") and read.unread is None
    assert read.optional == ("tensorflow", "triton", "wandb")
    # relative to the folder the job starts in
    assert program_imports("train.py", cwd=str(tmp_path)) == read


@pytest.mark.parametrize("change", ["sys.path.insert(0, os.path.join(here, '..', 'lib'))",
                                    "sys.path.append('/project/p/src')", "sys.path += ['/p']",
                                    "sys.path[:0] = ['/p']", "site.addsitedir('/p')"])
def test_imports_below_a_change_of_sys_path_may_come_from_there(tmp_path, change):
    """The guides' programs reach a folder of their project this way: what they import from it
    cannot be known here, and is not asked of the job's Python (which would refuse the job)."""
    from scaletrain.envs.imports import program_imports

    program = tmp_path / "train.py"
    program.write_text(f"import os, site, sys\nimport numpy\nhere = os.path.dirname(__file__)\n{change}\n"
                       "from cifar10_cnn import Net\nimport horovod.torch as hvd\n")
    assert program_imports(str(program)) == ProgramImports(needed=("numpy",))


@pytest.mark.parametrize("script, text, why", [
    ("missing.py", None, "missing.py: no such file here"), ("job.sh", "#!/bin/bash\necho $X\n", "is not Python"),
    ("broken.py", "def (:\n", "is not Python as Python 3."), ("bin.py", "\0\0", "is not Python"),
    ("folder", "", "a folder, not a regular file"),
])
def test_a_program_that_cannot_be_read_as_python_says_why(tmp_path, script, text, why):
    from scaletrain.envs.imports import program_imports

    if script == "folder":
        (tmp_path / script).mkdir()
    elif text is not None:
        (tmp_path / script).write_text(text)
    read = program_imports(script, cwd=str(tmp_path))
    assert read.unread is not None and why in read.unread and read.needed == read.optional == ()


def test_a_module_is_read_from_the_folder_the_job_starts_in_else_asked_of_the_jobs_python(tmp_path):
    from scaletrain.envs.imports import program_imports

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("import numpy\ndef main():\n    import wandb\n")
    assert program_imports("-m", ("pkg.train", "--lr", "1"), cwd=str(tmp_path)) == \
        ProgramImports(needed=("numpy",), optional=("wandb",))
    installed = program_imports("-m", ("somepkg.train",), cwd=str(tmp_path))
    assert installed.needed == ("somepkg",) and installed.unread is None and "not read here" in installed.note
    assert program_imports("-m", ("json.tool",), cwd=str(tmp_path)) == ProgramImports()   # the standard library
    assert program_imports("-m", (), cwd=str(tmp_path)).unread


# ------------------------------------------------------------------------------------- Horovod

@pytest.mark.parametrize("cluster, why", [
    ("roihu", "CSC's modules on Roihu include no Horovod"),
    ("lumi", "neither the LUMI AI Factory image the job runs nor CSC's modules on LUMI include Horovod"),
])
def test_a_horovod_program_is_refused_where_the_centre_has_none(hvd_program, cluster, why):
    imports = ("horovod", "torch")
    with pytest.raises(PlanError) as err:
        plan_for(cluster, gpus=4, launcher="mpi", script=str(hvd_program), program_imports=imports)
    assert "imports horovod" in err.value.message and why in err.value.message
    assert "--venv DIR" in err.value.hint and "--container IMAGE" in err.value.hint
    # the user's own environment: planned, and its Python is asked for horovod before sbatch
    from scaletrain.envs.check import needed_imports

    plan = plan_for(cluster, gpus=4, launcher="mpi", script=str(hvd_program), program_imports=imports,
                    venv="/scratch/p/hvd-venv")
    assert needed_imports(plan) == ("horovod", "torch")
    assert any("C++17" in n for n in notes(plan))   # what building it against the module's torch takes


def test_horovod_imported_inside_main_still_makes_a_horovod_job(tmp_path):
    """Many Horovod programs import it in main(): an import on some paths only is not asked of the
    job's Python (optional), but Horovod decides how the job is launched wherever it is imported,
    so the program is planned (and refused on Roihu) as a Horovod program all the same."""
    from scaletrain.envs.imports import program_imports

    program = tmp_path / "train.py"
    program.write_text("import torch\n\ndef main():\n    import horovod.torch as hvd\n    hvd.init()\n")
    read = program_imports(str(program))
    assert read.needed == ("torch",) and read.optional == ("horovod",)
    assert read.for_plan == ("horovod", "torch")
    with pytest.raises(PlanError) as err:
        plan_for("roihu", gpus=4, launcher="mpi", script=str(program), program_imports=read.for_plan)
    assert "imports horovod" in err.value.message


def test_a_horovod_program_on_the_alliance_gets_the_wheelhouse_note():
    plan = plan_for("fir", gpus=4, launcher="mpi", program_imports=("horovod", "torch"), account="def-p")
    assert any("--with horovod" in n for n in notes(plan))
    # a program known not to use Horovod gets no Horovod note at all
    plain = plan_for("fir", gpus=4, launcher="mpi", program_imports=("torch",), account="def-p")
    assert not any("Horovod" in n for n in notes(plain))


def test_a_horovod_program_needs_one_task_per_gpu():
    with pytest.raises(UsageError, match="--launcher mpi"):
        plan_for("fir", gpus=4, launcher="torchrun", program_imports=("horovod",), account="def-p")


# ---------------------------------------------------------------------------------- TensorFlow

@pytest.mark.parametrize("cluster, setup, absent", [
    ("roihu", ["module load python-tensorflow"], "python-pytorch"),
    ("lumi", ["module use /appl/local/csc/modulefiles", "module load tensorflow/2.16"], "singularity"),
    ("fir", ["module load python", "module load cuda cudnn"], "import scaletrain"),
    ("trillium", ["module load python/3.11.5", "module load cuda cudnn"], "import scaletrain"),
])
def test_a_tensorflow_job_runs_on_the_centres_tensorflow_without_scaletrain(cluster, setup, absent):
    from scaletrain.envs.check import needed_imports

    kw = {"account": "def-p"} if cluster in ("fir", "trillium") else {}
    plan = plan_for(cluster, nodes=2, launcher="tensorflow", **kw)
    text = render_for(cluster, nodes=2, launcher="tensorflow", **kw)
    lines = text.splitlines()
    assert all(line in lines for line in setup), setup
    assert absent not in text and "import scaletrain" not in text
    assert not plan.software.check_scaletrain and not plan.software.warnings
    assert needed_imports(plan) == ("tensorflow",)


def test_jupiter_refuses_tensorflow_without_an_environment():
    with pytest.raises(PlanError, match="no TensorFlow module"):
        plan_for("jupiter", nodes=2, launcher="tensorflow")


# ------------------------------------------------------------------------- the --venv folder

def test_a_venv_that_is_not_there_is_refused_even_where_the_nodes_python_cannot_run_here(monkeypatch, tmp_path):
    """Roihu's GPU nodes are aarch64: from an x86 login node the probe cannot run, the folder can be looked at."""
    from scaletrain.envs import check

    monkeypatch.setattr(check, "this_arch", lambda machine=None: "x86_64")
    ran = []
    monkeypatch.setattr(check, "_run", lambda *a, **kw: ran.append(a) or (0, ""))
    plan = plan_for("roihu", gpus=4, venv=str(tmp_path / "nope"))
    with pytest.raises(DistEnvError, match="no such folder here"):
        check.check_job_python(plan)
    half = tmp_path / "half"
    (half / "bin").mkdir(parents=True)
    (half / "pyvenv.cfg").write_text("home = /usr/bin\n")
    with pytest.raises(DistEnvError, match="not a finished venv: it has no bin/activate"):
        check.check_job_python(_with_request(plan, venv=str(half)))
    (half / "bin" / "activate").write_text("")
    note = check.check_job_python(_with_request(plan, venv=str(half))).not_checked
    assert note and "not checked here" in note and "aarch64" in note
    with pytest.raises(DistEnvError, match="no conda-meta"):
        check.check_job_python(_with_request(plan, venv=None, conda=str(tmp_path / "envs" / "mine")))
    assert not ran   # nothing was run: the probe cannot run this CPU's Python there


def _with_request(plan, **changes):
    """``plan`` with its settled request changed (a folder looked at by the check, not planned again)."""
    request = dataclasses.replace(plan.settled.request, **changes)
    return dataclasses.replace(plan, settled=dataclasses.replace(plan.settled, request=request))


# ------------------------------------------------------------------ DeepSpeed under --cpu, Horovod's store

def test_cpu_smoke_gives_deepspeed_its_cpu_accelerator_unless_the_user_chose_one():
    from scaletrain.launch.inproc.worker_shim import launcher_env

    def env(environ):
        return launcher_env(environ=environ, emulate=None, nodes=1, cpu=True, job_id="1")

    assert env({})["DS_ACCELERATOR"] == "cpu"
    assert "DS_ACCELERATOR" not in env({"DS_ACCELERATOR": "cuda"})   # the user's, inherited as it is
    assert "DS_ACCELERATOR" not in launcher_env(environ={}, emulate=None, nodes=1, cpu=False, job_id="1")


def test_a_cuda_extension_build_under_cpu_is_one_line(capsys):
    """torch's cpp_extension (DeepSpeed's fused ops) without CUDA_HOME: the promised --cpu line."""
    import sys

    import torch  # noqa: F401 - the hook judges only where the program imported torch

    from scaletrain.launch.inproc import cpu_smoke

    previous = sys.excepthook
    try:
        cpu_smoke.install_cuda_missing_hook("1", mapped=True)
        try:
            raise OSError("CUDA_HOME environment variable is not set. Please set it to your CUDA install root.")
        except OSError as exc:
            sys.excepthook(type(exc), exc, exc.__traceback__)
    finally:
        sys.excepthook = previous
    err = capsys.readouterr().err
    assert err.startswith("scaletrain: rank 1: --cpu could not map the CUDA call at ")
    assert "(OSError: CUDA_HOME environment variable is not set." in err and "Traceback" not in err


def test_horovods_gloo_store_answers_as_horovodrun_does():
    from scaletrain.frameworks.horovod import RENDEZVOUS_VAR, horovod_vars, rendezvous_store

    with rendezvous_store(False) as none:
        assert none == {}
    with rendezvous_store() as env:
        where = env[RENDEZVOUS_VAR]
        url = f"http://{where}/global/rank_0"
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(url, timeout=10)
        assert missing.value.code == 404   # not there yet: Horovod's client polls
        put = urllib.request.Request(url, data=b"\x00addr", method="PUT")
        assert urllib.request.urlopen(put, timeout=10).status == 200
        assert urllib.request.urlopen(url, timeout=10).read() == b"\x00addr"
        bye = urllib.request.Request(f"http://{where}/global/0", method="DELETE")
        assert urllib.request.urlopen(bye, timeout=10).status == 200
        got = horovod_vars(env, rank=3, world=4, local_rank=1, local_size=2, node=1, nodes=2, host="emu-node2")
    host, port = where.rsplit(":", 1)
    assert got == {"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
                   "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_HOSTNAME": "emu-node2",
                   "HOROVOD_GLOO_RENDEZVOUS_ADDR": host, "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
                   "HOROVOD_GLOO_IFACE": "lo", "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
    assert horovod_vars({}, rank=0, world=1, local_rank=0, local_size=1, node=0, nodes=1, host="x") == {}


def test_a_tensorflow_venv_without_tensorflow_is_sent_back_to_the_centres_module(monkeypatch, tmp_path):
    from scaletrain.envs import check

    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    (venv / "pyvenv.cfg").write_text("")
    monkeypatch.setattr(check, "this_arch", lambda machine=None: "aarch64")
    monkeypatch.setattr(check, "_run", lambda *a, **kw: (check._MISSING_EXIT, "scaletrain-check:stage:probe\n"
                                                                 "scaletrain-check:missing:tensorflow\n"))
    with pytest.raises(DistEnvError) as err:
        check.check_job_python(plan_for("roihu", nodes=2, launcher="tensorflow", venv=str(venv)))
    assert "cannot import tensorflow" in err.value.message
    assert "module load python-tensorflow" in err.value.hint
    assert "scaletrain env create --cluster roihu --with tensorflow DIR" in err.value.hint   # made on that module
