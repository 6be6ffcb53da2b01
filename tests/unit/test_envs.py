"""The job's software: the environment running scaletrain on a login node, the plan-time warning
away from one, the in-job guards that name the real cause, and ``scaletrain env create``."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import module_python, run_cli

import scaletrain
from scaletrain.clusters.profile import load_profile, profile_from_dict
from scaletrain.envs import detect
from scaletrain.envs.create import EnvRecipe, create_script
from scaletrain.plan.planner import make_plan
from scaletrain.plan.render import render_script
from scaletrain.plan.request import JobRequest

BASH = shutil.which("bash")
PKG = os.path.dirname(scaletrain.__file__)


def test_login_node_needs_sbatch_and_a_slurm_configuration() -> None:
    yes = lambda name: "/usr/bin/sbatch"   # noqa: E731
    no = lambda name: None                 # noqa: E731
    assert detect.on_login_node(environ={"SLURM_CONF": "/s/slurm.conf"}, which=yes, exists=lambda p: p == "/s/slurm.conf")
    assert detect.on_login_node(environ={}, which=yes, exists=lambda p: p == "/etc/slurm/slurm.conf")
    assert not detect.on_login_node(environ={}, which=yes, exists=lambda p: False)   # sbatch, no cluster
    assert not detect.on_login_node(environ={"SLURM_CONF": "/s"}, which=no, exists=lambda p: True)


def test_running_environment_is_the_venv_then_conda_then_the_interpreter() -> None:
    venv = detect.running_environment(environ={}, prefix="/p/venv", base_prefix="/usr", executable="/p/venv/bin/python")
    conda = detect.running_environment(environ={"CONDA_PREFIX": "/c/env"}, prefix="/c/env", base_prefix="/c/env",
                                       executable="/c/env/bin/python")
    plain = detect.running_environment(environ={}, prefix="/usr", base_prefix="/usr", executable="/usr/bin/python3")
    assert (venv.kind, venv.path) == ("venv", "/p/venv")
    assert (conda.kind, conda.path) == ("conda", "/c/env")
    assert (plain.kind, plain.path) == ("python", "/usr/bin/python3")


def _plan_cli(capsys, monkeypatch, *, login: bool, found=None, extra=()):
    monkeypatch.setattr(detect, "on_login_node", lambda **kw: login)
    if found is not None:
        monkeypatch.setattr(detect, "running_environment", lambda **kw: found)
    return run_cli(capsys, "plan", "--cluster", "roihu", "--gpus", "4", "--account", "project_1", *extra,
                   "--", "train.py")


def test_on_a_login_node_the_job_gets_the_running_venv(capsys, monkeypatch) -> None:
    code, out, err = _plan_cli(capsys, monkeypatch, login=True, found=detect.RunningEnv("venv", "/proj/st-env"))
    assert code == 0 and "source /proj/st-env/bin/activate" in out
    assert "software: venv /proj/st-env (the venv running scaletrain on this login node)" in err
    assert "warning:" not in err
    code, out, err = _plan_cli(capsys, monkeypatch, login=True, found=detect.RunningEnv("python", "/opt/py 3/bin/python3"))
    assert "'/opt/py 3/bin/python3' -u train.py" in out        # the interpreter itself, quoted
    assert "command -v '/opt/py 3/bin/python3'" in out


def test_the_running_interpreter_keeps_its_name_when_the_set_up_gives_it(capsys, monkeypatch) -> None:
    here = shutil.which("python3")
    assert here
    code, out, err = _plan_cli(capsys, monkeypatch, login=True, found=detect.RunningEnv("python", here))
    assert code == 0 and " python3 -u train.py" in out and here not in out
    assert "software: python3 (the Python running scaletrain on this login node)" in err
    assert "warning:" not in err


def test_env_create_refuses_a_retired_system(capsys, tmp_path: Path, monkeypatch) -> None:
    assert load_profile("mahti").retired
    code, _, err = run_cli(capsys, "env", "create", "--cluster", "mahti", str(tmp_path / "e"))
    assert code == 2 and "successor is roihu" in err and not (tmp_path / "e").exists()


def test_away_from_a_cluster_the_plan_warns_with_the_fix(capsys, monkeypatch) -> None:
    code, out, err = _plan_cli(capsys, monkeypatch, login=False)
    assert code == 0 and "warning: the job will not find scaletrain" in err
    assert "scaletrain env create --cluster roihu DIR" in err and "--venv DIR" in err
    code, out, err = _plan_cli(capsys, monkeypatch, login=False, extra=("--venv", "/proj/env"))
    assert "warning:" not in err and "software: venv /proj/env (--venv)" in err
    code, out, err = _plan_cli(capsys, monkeypatch, login=False, extra=("--launcher", "torchrun"))
    assert "warning:" not in err                                 # torchrun needs no scaletrain in the job
    code, out, err = _plan_cli(capsys, monkeypatch, login=False, extra=("--container", "/p/mine.sif"))
    assert "warning:" not in err                                 # the user's own image may have it


def test_alliance_launcher_package_missing_is_warned(capsys, monkeypatch) -> None:
    monkeypatch.setattr(detect, "on_login_node", lambda **kw: False)
    code, _, err = run_cli(capsys, "plan", "--cluster", "narval", "--gpus", "4", "--account", "def-x",
                           "--launcher", "accelerate", "--", "train.py")
    assert code == 0 and "not accelerate" in err and "--with accelerate" in err


def _lumi_container():
    """LUMI's profile: the AI Factory container by default, run with singularity."""
    lumi = load_profile("lumi")
    assert lumi.software == "container" and lumi.default_image and lumi.container == "singularity exec"
    return lumi


def _run_guarded(script: str, tmp_path: Path, tools: dict[str, str]) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools.items():
        (bin_dir / name).write_text("#!" + BASH + "\n" + body)
        (bin_dir / name).chmod(0o755)
    for name in ("mktemp", "mkdir", "hostname"):   # what a profile's set-up lines may call
        found = shutil.which(name)
        if found and not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(found)
    job = tmp_path / "job.sh"
    job.write_text(script)
    return subprocess.run([BASH, str(job)], env={"PATH": str(bin_dir), "SLURM_JOB_ID": "1"},
                          capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(BASH is None, reason="bash not installed")
def test_missing_container_runtime_is_named_not_cannot_import(tmp_path: Path) -> None:
    profile = _lumi_container()
    plan = make_plan(JobRequest(cluster="lumi", script="t.py", gpus=8, account="project_1"), profile)
    r = _run_guarded(render_script(plan), tmp_path, {"module": "exit 0\n"})
    assert r.returncode == 3 and "singularity is not on PATH" in r.stderr
    assert "cannot import" not in r.stderr


@pytest.mark.skipif(BASH is None, reason="bash not installed")
def test_module_that_gave_no_python_is_named_not_cannot_import(tmp_path: Path) -> None:
    plan = make_plan(JobRequest(cluster="roihu", script="t.py", gpus=4, account="project_1"), load_profile("roihu"))
    r = _run_guarded(render_script(plan), tmp_path, {"module": "exit 0\n"})   # a module load that did nothing
    assert r.returncode == 3 and "python3 is not on PATH after the set-up" in r.stderr
    assert "cannot import" not in r.stderr


def test_the_lumi_container_runs_the_program_and_a_venv_made_in_it(capsys) -> None:
    profile = _lumi_container()
    plan = make_plan(JobRequest(cluster="lumi", script="t.py", gpus=8, account="project_1", launcher="accelerate",
                                venv="/project/p/env"), profile)
    text = render_script(plan)
    assert "export SINGULARITYENV_PREPEND_PATH=/project/p/env/bin" in text
    assert f"{profile.default_image} accelerate launch" in text
    assert "module load pytorch" not in text
    module = make_plan(JobRequest(cluster="lumi", script="t.py", gpus=8, account="project_1",
                                  modules=("pytorch",)), profile)
    assert not module.software.container and "module load pytorch" in render_script(module)   # CSC's module on request


def test_create_recipes_follow_the_profile() -> None:
    roihu = create_script(load_profile("roihu"), EnvRecipe(directory="/p/env", packages=("deepspeed",)),
                          scaletrain_dir=PKG)
    assert "module load python-pytorch" in roihu and "python3 -m venv --system-site-packages /p/env" in roihu
    assert "/p/env/bin/python -m pip install --quiet deepspeed" in roihu
    narval = create_script(load_profile("narval"), EnvRecipe(directory="/p/env", packages=("accelerate",)),
                           scaletrain_dir=PKG)
    assert "pip install --no-index --quiet torch numpy" in narval
    assert "pip install --no-index --quiet accelerate" in narval and "--system-site-packages" not in narval
    lumi = _lumi_container()
    inside = create_script(lumi, EnvRecipe(directory="/p/env", image=lumi.default_image), scaletrain_dir=PKG)
    assert f"{lumi.default_image} python3 -m venv --system-site-packages /p/env" in inside


@pytest.mark.parametrize("cluster, module", [("roihu", "module load python-tensorflow"),
                                             ("lumi", "module load tensorflow/2.16")])
def test_a_tensorflow_venv_is_made_on_the_centres_tensorflow_module(cluster: str, module: str) -> None:
    """CSC: 'The virtual environment needs to be created with the correct python module activated'."""
    profile = load_profile(cluster)
    text = create_script(profile, EnvRecipe(directory="/p/tf", packages=("tensorflow",)), scaletrain_dir=PKG)
    assert module in text and "python-pytorch" not in text and "singularity" not in text
    assert "python3 -m venv --system-site-packages /p/tf" in text
    assert "install --quiet tensorflow" not in text and "torch" not in text   # the module's tensorflow
    assert "/p/tf/bin/python -c 'import scaletrain, tensorflow'" in text
    # the job that uses it loads the same module, then the venv
    plan = make_plan(JobRequest(cluster=cluster, script="t.py", gpus=2, account="project_1",
                                launcher="tensorflow", venv="/p/tf"), profile)
    setup = render_script(plan)
    assert setup.index(module) < setup.index("source /p/tf/bin/activate")


def test_a_tensorflow_venv_on_the_alliance_comes_from_the_wheelhouse_without_torch() -> None:
    text = create_script(load_profile("narval"), EnvRecipe(directory="/p/tf", packages=("tensorflow",)),
                         scaletrain_dir=PKG)
    assert "module load cuda cudnn" in text and "pip install --no-index --quiet tensorflow" in text
    assert "torch" not in text


def test_create_cli_dry_run_and_bad_input(capsys, tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "env", "create", "--cluster", "roihu", "--with", "lightning", "--dry-run",
                             str(tmp_path / "e"))
    assert code == 0 and "pip install --quiet lightning" in out and f"--venv {tmp_path / 'e'}" in err
    code, _, err = run_cli(capsys, "env", "create", "--cluster", "roihu", "--with", "horovod", str(tmp_path / "e"))
    assert code == 2 and "accelerate, deepspeed, lightning" in err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    code, _, err = run_cli(capsys, "env", "create", "--cluster", "roihu", str(tmp_path / "full"))
    assert code == 2 and "not empty" in err and (tmp_path / "full" / "x").read_text() == "mine"
    code, _, err = run_cli(capsys, "env", "create", str(tmp_path / "e"))
    assert code == 2 and "--cluster" in err


@pytest.mark.skipif(BASH is None, reason="bash not installed")
def test_create_builds_a_venv_that_imports_its_own_scaletrain(capsys, tmp_path: Path) -> None:
    """A stand-in cluster whose 'module' is a Python with torch (helpers.module_python): the venv
    sees torch through --system-site-packages and has its own copy of scaletrain."""
    if importlib.util.find_spec("ensurepip") is None:  # e.g. Ubuntu's python3 without python3-venv
        pytest.skip("needs `python -m venv` with pip (ensurepip), which this Python lacks")
    data = {"name": "standin", "gpus_per_node": 1, "cores_per_node": 2, "mem_per_node_gb": 4,
            "python": str(module_python(tmp_path / "module")), "partitions": {"p": {"default": True}}}
    profile_file = tmp_path / "standin.toml"
    profile_file.write_text("\n".join(f"{k} = {v!r}" for k, v in data.items() if k != "partitions")
                            .replace("'", '"') + '\n[partitions.p]\ndefault = true\n')
    profile_from_dict(data)   # the same data is a valid profile
    env_dir = tmp_path / "env"
    code, out, err = run_cli(capsys, "env", "create", "--profile", str(profile_file), str(env_dir))
    assert code == 0, err
    assert out.strip() == f"--venv {env_dir}"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import scaletrain, torch; print(scaletrain.__file__)"],
                       capture_output=True, text=True, env=clean, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(env_dir))


def test_create_warns_when_this_machine_is_not_the_gpu_nodes_architecture(capsys, tmp_path: Path, monkeypatch) -> None:
    import platform

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    code, _, err = run_cli(capsys, "env", "create", "--cluster", "roihu", "--dry-run", str(tmp_path / "e"))
    assert code == 0 and "this machine is x86_64, roihu's GPU nodes are aarch64" in err
    code, _, err = run_cli(capsys, "env", "create", "--cluster", "narval", "--dry-run", str(tmp_path / "e"))
    assert code == 0 and "this machine is" not in err
