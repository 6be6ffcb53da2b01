"""The one submit path (CLI and ``scaletrain.submit()``): the job's Python is asked before sbatch,
the job id survives a disk that fills up, the API's values are checked, venv names are safe.

A stand-in cluster: a profile without modules, a fake ``sbatch`` that records that it ran, and a
``slurm.conf`` so that this machine counts as a login node (``scaletrain.envs.detect``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import module_python, run_cli

import scaletrain
from scaletrain.errors import DistEnvError, ScaletrainError, UsageError

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash not installed")


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch) -> dict[str, Path]:
    """A stand-in login node: profile file, fake sbatch on PATH, SLURM_CONF; no PYTHONPATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\nenv > {bin_dir}/sbatch.env\necho 4242\n")
    (bin_dir / "sbatch").chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=standin\n")
    profile = tmp_path / "standin.toml"
    profile.write_text('name = "standin"\ngpus_per_node = 2\ncores_per_node = 4\nmem_per_node_gb = 8\n'
                       'account_required = false\n[partitions.p]\ndefault = true\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.delenv("PYTHONPATH", raising=False)   # the job's Python finds scaletrain by itself or not at all
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")           # env create's optional crc32c: no index, fail fast
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('training')\n")   # the check reads the program the job runs
    return {"bin": bin_dir, "profile": profile, "called": bin_dir / "sbatch.env"}


def _installed_here() -> bool:
    """scaletrain imports in this interpreter without PYTHONPATH (pip-installed, as for a user)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", "import scaletrain"], env=env, cwd="/",
                          capture_output=True, timeout=120).returncode == 0


# These stand-ins use this interpreter as the cluster's own Python, whose jobs find scaletrain "by
# themselves or not at all" (no PYTHONPATH): in the torch-range venvs scaletrain is on PYTHONPATH only
needs_installed = pytest.mark.skipif(not _installed_here(), reason="scaletrain is not installed in this "
                                     "interpreter (found through PYTHONPATH only, as in the torch-range venvs)")


def _bare_venv(where: Path) -> Path:
    """A venv of this interpreter without its site-packages: no scaletrain, no torch."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    return where


def test_cli_refuses_a_job_whose_python_lacks_scaletrain_before_sbatch(capsys, cluster, tmp_path) -> None:
    venv = _bare_venv(tmp_path / "bare")
    code, out, err = run_cli(capsys, "submit", "--profile", str(cluster["profile"]), "--gpus", "2",
                             "--venv", str(venv), "--run-dir", str(tmp_path / "run"), "--", "train.py")
    assert code == DistEnvError.exit_code, err
    assert "would stop at its first line" in err and "cannot import scaletrain, torch" in err
    assert "scaletrain env create --cluster standin" in err and "--venv DIR" in err
    assert "Traceback" not in err and out == ""
    assert not cluster["called"].exists()            # sbatch never ran
    assert not (tmp_path / "run").exists()           # and no run folder was left behind


def test_api_refuses_the_same_job_before_sbatch(cluster, tmp_path) -> None:
    venv = _bare_venv(tmp_path / "bare")
    with pytest.raises(DistEnvError, match="cannot import scaletrain"):
        scaletrain.submit(cluster=str(cluster["profile"]), gpus=2, program=["train.py"], venv=str(venv),
                          run_dir=tmp_path / "run")
    assert not cluster["called"].exists()


@needs_installed
def test_a_job_with_the_environment_env_create_made_is_submitted(capsys, cluster, tmp_path) -> None:
    # the stand-in's "module" is a Python with torch (helpers.module_python): the venv sees torch
    # through --system-site-packages and gets its own copy of scaletrain
    python = module_python(tmp_path / "module")
    text = cluster["profile"].read_text().replace('name = "standin"\n',
                                                  f'name = "standin"\npython = "{python}"\n')
    cluster["profile"].write_text(text)
    env_dir = tmp_path / "st-env"
    code, _, err = run_cli(capsys, "env", "create", "--profile", str(cluster["profile"]), str(env_dir))
    assert code == 0, err
    code, out, err = run_cli(capsys, "submit", "--profile", str(cluster["profile"]), "--gpus", "2",
                             "--venv", str(env_dir), "--run-dir", str(tmp_path / "run"), "--", "train.py")
    assert code == 0, err
    assert out == "4242\n" and (tmp_path / "run" / "job_id").read_text() == "4242\n"
    assert cluster["called"].exists()


def test_on_a_login_node_the_api_gives_the_job_the_running_python_and_sbatch_account(cluster, tmp_path,
                                                                                        monkeypatch) -> None:
    """The same environment rule and account default as the CLI: the venv running scaletrain
    (which finds it through PYTHONPATH, as the job will) and $SBATCH_ACCOUNT."""
    from scaletrain.envs import detect

    running = tmp_path / "running"
    subprocess.run([str(module_python(tmp_path / "module")), "-m", "venv", "--without-pip",
                    "--system-site-packages", str(running)], check=True, timeout=120)
    monkeypatch.setattr(detect, "running_environment", lambda **kw: detect.RunningEnv("venv", str(running)))
    monkeypatch.setenv("PYTHONPATH", str(Path(scaletrain.__file__).parent.parent))
    monkeypatch.setenv("SBATCH_ACCOUNT", "project_9")
    job = scaletrain.submit(cluster=str(cluster["profile"]), gpus=2, program=["train.py"], run_dir=tmp_path / "run",
                            env={"MY_FLAG": "1"})
    assert job.job_id == "4242"
    script = (tmp_path / "run" / "job.sh").read_text()
    assert "#SBATCH --account=project_9" in script
    assert f"source {running}/bin/activate" in script
    seen = dict(line.split("=", 1) for line in cluster["called"].read_text().splitlines() if "=" in line)
    assert seen["MY_FLAG"] == "1" and seen["SBATCH_ACCOUNT"] == "project_9"   # added to, not instead of
    assert seen["PATH"] == os.environ["PATH"]


def test_the_users_setup_lines_run_before_the_jobs_python_is_asked(capsys, cluster, tmp_path) -> None:
    """--setup lines run here too, as in the job (after the set-up): what they leave is what is asked."""
    venv = _bare_venv(tmp_path / "bare")
    args = ["submit", "--profile", str(cluster["profile"]), "--gpus", "2", "--venv", str(venv)]
    code, _, err = run_cli(capsys, *args, "--setup", "export PYTHONPATH=/somewhere", "--run-dir",
                           str(tmp_path / "run"), "--", "train.py")
    assert code == DistEnvError.exit_code, err
    assert "cannot import scaletrain" in err and not cluster["called"].exists()
    # a line that makes the environment the job needs: the job's Python (the bare venv) then finds them
    where = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    code, out, err = run_cli(capsys, *args, "--setup", f"export PYTHONPATH={where}", "--run-dir",
                             str(tmp_path / "run2"), "--", "train.py")
    assert code == 0 and out == "4242\n", err


def _fake_module(bin_dir: Path) -> None:
    """Lmod's 'module' as a login node has it: an unknown name is an error (exit 1) in its own words."""
    (bin_dir / "module").write_text('#!/bin/sh\n[ "$1" = load ] && shift && for m in "$@"; do\n'
                                    '  echo "Lmod has detected the following error: The following module(s) are '
                                    'unknown: $m" >&2; exit 1\ndone\nexit 0\n')
    (bin_dir / "module").chmod(0o755)


def test_a_failing_set_up_is_refused_with_its_own_line(capsys, cluster, tmp_path) -> None:
    _fake_module(cluster["bin"])
    code, _, err = run_cli(capsys, "submit", "--profile", str(cluster["profile"]), "--gpus", "2",
                           "--module", "no-such-module", "--run-dir", str(tmp_path / "run"), "--", "train.py")
    assert code == DistEnvError.exit_code and "set-up fails on this login node (exit 1: " in err
    assert "module(s) are unknown: no-such-module" in err
    assert not cluster["called"].exists()


def test_a_failing_setup_line_is_refused_with_its_status_and_last_line(capsys, cluster, tmp_path) -> None:
    """The job runs --setup lines under 'set -e': one that fails would stop it. A refusal, not a warning."""
    code, out, err = run_cli(capsys, "submit", "--profile", str(cluster["profile"]), "--gpus", "2", "--setup",
                             "echo preparing; echo 'cp: cannot stat data.tar' >&2; exit 7",
                             "--run-dir", str(tmp_path / "run"), "--", "train.py")
    assert code == DistEnvError.exit_code, err
    assert "a --setup line fails on this login node (exit 7: cp: cannot stat data.tar)" in err
    assert "--no-check" in err and "Traceback" not in err and out == ""
    assert not cluster["called"].exists() and not (tmp_path / "run").exists()


def test_a_setup_line_that_reads_a_variable_only_the_job_has_is_not_refused(capsys, cluster, tmp_path,
                                                                           monkeypatch) -> None:
    """Run under 'set -u' here: $SLURM_TMPDIR stops the line instead of expanding to nothing (the
    line below would empty a folder of this machine); the job's Python is then asked without them."""
    monkeypatch.setenv("PYTHONPATH", str(Path(scaletrain.__file__).parent.parent))
    monkeypatch.delenv("SLURM_TMPDIR", raising=False)
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "mine.txt").write_text("mine\n")
    code, out, err = run_cli(capsys, "submit", "--profile", str(cluster["profile"]), "--gpus", "2", "--setup",
                             f"rm -rf $SLURM_TMPDIR{keep}/*", "--run-dir", str(tmp_path / "run"), "--", "train.py")
    assert code == 0 and out == "4242\n", err
    assert "your --setup lines were not run here" in err and "SLURM_TMPDIR: unbound variable" in err
    assert (keep / "mine.txt").exists()


def test_a_container_runtime_missing_here_is_a_warning(capsys, cluster, tmp_path) -> None:
    code, _, err = run_cli(capsys, "submit", "--profile", str(cluster["profile"]), "--gpus", "2",
                           "--container", str(tmp_path / "img.sif"), "--run-dir", str(tmp_path / "run"), "--",
                           "train.py")
    assert code == 0, err
    assert "warning: not checked here: whether the image" in err and "runtime is not on PATH" in err
    assert "# check before sbatch: not checked here: whether the image" in (tmp_path / "run" / "job.sh").read_text()


def _fake_apptainer(bin_dir: Path, python: str) -> None:
    """'apptainer exec [--nv] [-B DIR]... IMAGE python3 ARGS': runs ``python`` ARGS (the image's Python)."""
    (bin_dir / "apptainer").write_text(
        "#!/bin/bash\nshift\nwhile [ \"${1#-}\" != \"$1\" ]; do [ \"$1\" = -B ] && shift; shift; done\n"
        f'shift 2\nexec {python} "$@"\n')
    (bin_dir / "apptainer").chmod(0o755)


@needs_installed
def test_a_container_is_checked_inside_the_image(capsys, cluster, tmp_path) -> None:
    bare = _bare_venv(tmp_path / "bare")
    _fake_apptainer(cluster["bin"], str(bare / "bin" / "python3"))
    args = ["submit", "--profile", str(cluster["profile"]), "--gpus", "2", "--container", str(tmp_path / "img.sif")]
    code, _, err = run_cli(capsys, *args, "--run-dir", str(tmp_path / "run"), "--", "train.py")
    assert code == DistEnvError.exit_code and f"inside {tmp_path / 'img.sif'} cannot import scaletrain" in err
    assert not cluster["called"].exists()
    _fake_apptainer(cluster["bin"], sys.executable)   # an image that has scaletrain and torch
    code, out, err = run_cli(capsys, *args, "--run-dir", str(tmp_path / "run2"), "--", "train.py")
    assert code == 0 and out == "4242\n" and "warning" not in err, err


def test_job_id_is_reported_when_it_cannot_be_written(capsys, cluster, tmp_path, monkeypatch) -> None:
    from scaletrain.slurm import submit as slurm_submit

    real = slurm_submit.atomic_write

    def full(path, data, **kw):   # job.sh is written; the disk is full by the time sbatch answered
        if Path(path).name == slurm_submit.JOB_ID_FILE:
            raise OSError(28, "No space left on device")
        return real(path, data, **kw)

    monkeypatch.setattr(slurm_submit, "atomic_write", full)
    monkeypatch.setenv("PYTHONPATH", str(Path(scaletrain.__file__).parent.parent))
    code, out, err = run_cli(capsys, "submit", "--profile", str(cluster["profile"]), "--gpus", "2",
                             "--run-dir", str(tmp_path / "run2"), "--", "train.py")
    assert code == ScaletrainError.exit_code and "Traceback" not in err
    assert "job 4242 was submitted and is queued" in err and "No space left" in err and "scancel 4242" in err


def test_job_id_on_a_disk_that_fills_up_during_sbatch(capsys, cluster, tmp_path, monkeypatch) -> None:
    """A real full disk: a tmpfs that sbatch itself fills after job.sh was written."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                                           capture_output=True, timeout=30).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        (cluster["bin"] / "sbatch").write_text("#!/bin/sh\ncat /dev/zero > fill 2>/dev/null\necho 5151\n")
        monkeypatch.setenv("PYTHONPATH", str(Path(scaletrain.__file__).parent.parent))
        code, out, err = run_cli(capsys, "submit", "--profile", str(cluster["profile"]), "--gpus", "2",
                                 "--run-dir", str(disk / "run"), "--", "train.py")
        assert code != 0 and "job 5151 was submitted and is queued" in err and "scancel 5151" in err
        assert (disk / "run" / "job.sh").exists() and not (disk / "run" / "job_id").exists()
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, timeout=30)


@pytest.mark.parametrize("kwargs, needle", [
    ({"requeue": "no"}, "submit(): requeue must be True or False, got 'no'"),
    ({"gpus": "8"}, "submit(): gpus must be a whole number from 1 to 100,000, got '8'"),
    ({"gpus": True}, "submit(): gpus must be a whole number from 1 to 100,000, got True"),
    ({"nodes": 10 ** 9}, "submit(): nodes must be a whole number from 1 to 100,000, got 1000000000"),
    ({"time": 3600}, "submit(): time must be a time limit above 0 and at most 365 days"),
    ({"time": "01:00:00\n#SBATCH -A x"}, "submit(): time must be a time limit"),
    ({"partition": "gpu small"}, "submit(): partition must be a partition name"),
    ({"precision": "BF16"}, "submit(): precision must be one of 'fp32', "),
    ({"launcher": "TorchRun"}, "submit(): launcher must be one of 'scaletrain', "),
    ({"modules": 5}, "submit(): modules must be a list of names that do not start with '-' (each is a word of a command, not an option), got 5"),
    ({"modules": ["ok", 3]}, "submit(): modules must be a list of names that do not start with '-' (each is a word of a command, not an option), got ['ok', 3]"),
    ({"mem_per_gpu_gb": float("nan")}, "submit(): mem_per_gpu_gb must be a finite number from 0.000976562 to "
                                       "65536 (GB), got nan"),
    ({"mem_per_gpu_gb": 0.0001}, "submit(): mem_per_gpu_gb must be a finite number from 0.000976562"),
    ({"mem_per_gpu_gb": -4.0}, "submit(): mem_per_gpu_gb must be a finite number from 0.000976562"),
    ({"params": float("inf")}, "submit(): params must be a finite number from 1 to 1e+15, got inf"),
    ({"env": [("A", "1")]}, "submit(): env must be a dict of str to str"),
    ({"env": {"A": 1}}, "submit(): env must be a dict that maps str names to str values"),
    ({"program": "train.py"}, "submit(): program must be a list of str, got 'train.py'"),
    ({"program": ["train.py", 3]}, "submit(): program must be a list of str, got ['train.py', 3]"),
    ({"cluster": None}, "submit(): cluster must be a profile name or a .toml file (str), got None"),
    ({"run_dir": 5}, "submit(): run_dir must be a folder path (str or Path), got 5"),
    ({"script": "x.py"}, "script is set by submit() itself (use program=)"),
    ({"sbatch_extra": "begin=now"}, "submit(): sbatch_extra must be a dict of str to str"),
    ({"venv": "/p/$(touch pwned)"}, "activate script would hand to the shell"),
])
def test_api_values_are_checked_with_one_clear_error(cluster, tmp_path, kwargs, needle) -> None:
    args = {"cluster": str(cluster["profile"]), "gpus": 2, "program": ["train.py"], "run_dir": tmp_path / "run"}
    if "nodes" in kwargs:
        args.pop("gpus")
    args.update(kwargs)
    with pytest.raises(UsageError) as info:
        scaletrain.submit(**args)
    assert needle in info.value.message
    assert not cluster["called"].exists() and not (tmp_path / "run").exists()


def test_a_str_module_is_one_module(cluster, tmp_path, monkeypatch) -> None:
    from scaletrain.jobs.api_values import build_request

    req = build_request(cluster="standin", program=["t.py"], gpus=2, nodes=None, account=None, run_dir=None,
                        fields={"modules": "pytorch/2.9", "setup": "echo hi", "requeue": False})
    assert req.modules == ("pytorch/2.9",) and req.setup == ("echo hi",) and req.requeue is False


def test_gpus_beyond_the_bound_are_refused_however_they_are_asked(capsys) -> None:
    code, _, err = run_cli(capsys, "plan", "--cluster", "roihu", "--nodes", "100000", "--account", "p",
                           "--", "train.py")
    assert code == 2 and "more than 100,000 GPUs" in err


@pytest.mark.parametrize("name", ["$(touch pwned)", "a`id`b", 'q"x', "semi;colon", "back\\slash"])
def test_venv_names_the_shell_would_read_are_refused(capsys, tmp_path, name, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "env", "create", "--cluster", "roihu", "--dry-run", str(tmp_path / name))
    assert code == 2 and "activate script would hand to the shell" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "plan", "--cluster", "roihu", "--gpus", "1", "--account", "p",
                           "--venv", str(tmp_path / name), "--", "train.py")
    assert code == 2 and "activate script would hand to the shell" in err
    assert not (tmp_path / "pwned").exists() and not list(tmp_path.iterdir())


def test_the_check_is_bounded_and_ends_what_the_set_up_started(tmp_path) -> None:
    """A set-up that never ends (a module that hangs, with a child holding the output open) is a
    warning after the bound, not a wait for ever."""
    from scaletrain.clusters.profile import profile_from_dict
    from scaletrain.envs.check import check_job_python
    from scaletrain.plan.planner import make_plan
    from scaletrain.plan.request import JobRequest

    marker = tmp_path / "still-running"
    profile = profile_from_dict({"name": "standin", "gpus_per_node": 1, "cores_per_node": 2, "mem_per_node_gb": 4,
                                 "setup_lines": [f"(sleep 2; touch {marker}) & sleep 60"],
                                 "partitions": {"p": {"default": True}}})
    plan = make_plan(JobRequest(cluster="standin", script="t.py", gpus=1), profile)
    note = check_job_python(plan, environ=dict(os.environ), timeout=0.5).not_checked
    assert note is not None and "not checked" in note and "no answer within" in note
    time.sleep(3)     # the background child was killed with its group: it never touched the marker
    assert not marker.exists()


def test_values_reach_the_check_quoted(capsys, cluster, tmp_path) -> None:
    _fake_module(cluster["bin"])
    code, _, err = run_cli(capsys, "submit", "--profile", str(cluster["profile"]), "--gpus", "2",
                           "--module", f"$(touch {tmp_path}/pwned)", "--run-dir", str(tmp_path / "run"), "--",
                           "train.py")
    assert code == DistEnvError.exit_code and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("launcher, names", [
    ("scaletrain", ("scaletrain", "torch")), ("torchrun", ("torch",)), ("accelerate", ("accelerate",)),
    ("deepspeed", ("deepspeed",)), ("tensorflow", ("tensorflow",)), ("srun", ()),
])
def test_what_each_launch_needs_from_the_jobs_python(launcher, names) -> None:
    from scaletrain.clusters.profile import load_profile
    from scaletrain.envs.check import needed_imports
    from scaletrain.plan.planner import make_plan
    from scaletrain.plan.request import JobRequest

    plan = make_plan(JobRequest(cluster="narval", script="t.py", gpus=4, launcher=launcher, account="def-x"),
                     load_profile("narval"))
    assert needed_imports(plan) == names


@pytest.mark.parametrize("launcher, lacking", [("scaletrain", "scaletrain"), ("accelerate", "accelerate")])
def test_the_alliance_job_venv_is_judged_without_running_anything(launcher, lacking) -> None:
    """The job venv built from the centre's wheels holds torch (for these launchers): known before sbatch."""
    from scaletrain.clusters.profile import load_profile
    from scaletrain.envs.check import check_job_python
    from scaletrain.plan.planner import make_plan
    from scaletrain.plan.request import JobRequest

    plan = make_plan(JobRequest(cluster="narval", script="t.py", gpus=4, launcher=launcher, account="def-x"),
                     load_profile("narval"))
    with pytest.raises(DistEnvError, match=f"wheels has only torch, no {lacking}") as info:
        check_job_python(plan, environ={"PATH": "/nonexistent"})
    assert "scaletrain env create --cluster narval" in info.value.hint
    torchrun = make_plan(JobRequest(cluster="narval", script="t.py", gpus=4, launcher="torchrun", account="def-x"),
                         load_profile("narval"))
    assert check_job_python(torchrun, environ={"PATH": "/nonexistent"}).checked == ("torch",)


@needs_installed
def test_dry_run_checks_the_jobs_python_and_says_what_it_found(capsys, cluster, tmp_path) -> None:
    (tmp_path / "train.py").write_text("import json\nimport torch\n")
    code, out, err = run_cli(capsys, "submit", "--profile", str(cluster["profile"]), "--gpus", "2", "--dry-run",
                             "--run-dir", str(tmp_path / "run"), "--", "train.py")
    assert code == 0, err
    assert "scaletrain: checked here: the job's Python imports scaletrain, torch" in err
    assert not cluster["called"].exists() and (tmp_path / "run" / "job.sh").is_file()


@needs_installed
def test_a_program_import_the_jobs_python_lacks_is_refused_before_sbatch(capsys, cluster, tmp_path) -> None:
    """The program's own imports are asked for too (read from its file; nothing of it runs here)."""
    (tmp_path / "train.py").write_text("import torch\nimport surely_not_installed_xyz\n"
                                       "try:\n    import also_not_installed_abc\nexcept ImportError:\n    pass\n")
    for dry in ((), ("--dry-run",)):
        code, _, err = run_cli(capsys, "submit", "--profile", str(cluster["profile"]), "--gpus", "2", *dry,
                               "--run-dir", str(tmp_path / f"run{len(dry)}"), "--", "train.py")
        assert code == DistEnvError.exit_code, err
        assert "cannot import surely_not_installed_xyz" in err and "also_not_installed_abc" not in err
        assert "install what provides surely_not_installed_xyz into it" in err
    assert not cluster["called"].exists()
