"""The job finds its software: an environment made by ``scaletrain env create`` on a stand-in for a
centre's PyTorch module runs a submitted job that imports scaletrain from that environment; a plan
made where no environment is known warns, and nothing is submitted.

The stand-in module: ``module load fakepytorch`` (a shell function every batch shell gets through
``BASH_ENV``) puts a folder first on PATH whose ``python3`` has torch (``helpers.module_python``).
Without it, ``python3`` here is one without torch: the job only works through the module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
import pytest
from helpers import module_python

pytestmark = pytest.mark.slurm

JOB = """\
import scaletrain, torch
print("SCALETRAIN_FROM", scaletrain.__file__, flush=True)
"""
MODULE_FN = """\
module() {
  if [ "${1:-}" = load ] && [ "${2:-}" = fakepytorch ]; then export PATH="$FAKEMOD/bin:$PATH"; fi
  return 0
}
"""


@pytest.fixture()
def module_cluster(slurm_cluster, probed_profile, tmp_path):
    """(profile path, environment for the commands) with the stand-in module loaded by the profile."""
    text = probed_profile.read_text()
    assert tomllib.loads(text)["setup_lines"] == [], "the probed profile has set-up lines of its own"
    profile = tmp_path / "cimod.toml"
    profile.write_text(text.replace("setup_lines = []", 'setup_lines = ["module load fakepytorch"]')
                       .replace('name = "ci"', 'name = "cimod"'))
    fakemod = tmp_path / "fakemod"
    module_python(fakemod)
    bash_env = tmp_path / "module.sh"
    bash_env.write_text(MODULE_FN)
    # the system's folders only (no pyenv/venv of this interpreter): torch comes from the module
    path = os.pathsep.join(["/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"])
    env = {"BASH_ENV": str(bash_env), "FAKEMOD": str(fakemod), "PATH": path}
    return profile, env


def test_env_create_then_a_submitted_job_imports_scaletrain_from_it(slurm_cluster, module_cluster, tmp_path):
    profile, env = module_cluster
    venv = tmp_path / "st-env"
    made = slurm_cluster.scaletrain("env", "create", "--profile", str(profile), str(venv), extra_env=env,
                                    timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    assert made.stdout.strip() == f"--venv {venv}"
    job = tmp_path / "job.py"
    job.write_text(JOB)
    run_dir = tmp_path / "run"
    # the job must not see this checkout through PYTHONPATH: only the venv's scaletrain counts
    proc = slurm_cluster.scaletrain("submit", "--profile", str(profile), "--run-dir", str(run_dir),
                                    "--venv", str(venv), "--setup", "unset PYTHONPATH", "--wait", "--gpus", "1",
                                    "--device", "cpu", "--", str(job), extra_env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"software: venv {venv} (--venv)" in proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("SCALETRAIN_FROM"))
    assert line.split()[1].startswith(str(venv)), line


def test_without_the_module_the_venv_is_not_made(slurm_cluster, probed_profile, module_cluster, tmp_path):
    """The stand-in matters: on the bare profile python3 has no torch and env create says so."""
    _, env = module_cluster
    bare = shutil.which("python3", path=env["PATH"])
    if bare is None or subprocess.run([bare, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("the system's python3 is missing or has torch: no bare Python to compare with")
    made = slurm_cluster.scaletrain("env", "create", "--profile", str(probed_profile), str(tmp_path / "bare"),
                                    extra_env=env, timeout=300)
    assert made.returncode == 3, made.stdout + made.stderr
    assert "making" in made.stderr and "failed" in made.stderr


def test_plan_with_no_known_environment_warns_and_submits_nothing(slurm_cluster, probed_profile, tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    # away from a login node: no Slurm configuration this process can read
    proc = slurm_cluster.scaletrain("plan", "--profile", str(probed_profile), "--gpus", "1",
                                    "--job-name", "st_env_warn_marker", "--", str(job),
                                    extra_env={"SLURM_CONF": str(tmp_path / "no-such.conf")})
    assert proc.returncode == 0, proc.stderr
    assert "warning: the job will not find scaletrain" in proc.stderr
    assert "scaletrain env create --cluster ci DIR" in proc.stderr
    queue = slurm_cluster.run("scontrol", "show", "job", "-o")
    assert "st_env_warn_marker" not in queue.stdout
    # on the login node the same plan names the environment running scaletrain, and no warning
    here = slurm_cluster.scaletrain("plan", "--profile", str(probed_profile), "--gpus", "1", "--", str(job))
    assert here.returncode == 0 and "running scaletrain on this login node" in here.stderr
    assert "warning: the job will not find scaletrain" not in here.stderr
