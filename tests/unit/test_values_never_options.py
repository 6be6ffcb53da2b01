"""A value that reaches a command line never starts with '-' unless it is an option we wrote: a module,
a conda environment, a container image, a dataset, a framework config or the program itself that
starts with '-' was written into the job as an option (``module load --purge``, ``conda activate
--help``, ``python3 -u -c CODE``, which runs CODE). Each is refused where it enters, in one line."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from helpers import run_cli

import scaletrain
from scaletrain.clusters.profile import profile_from_dict
from scaletrain.errors import ProfileError, UsageError

PLAN = ("plan", "--cluster", "roihu", "--gpus", "4", "--account", "p")


@pytest.mark.parametrize("flag, value", [
    ("--module", "--purge"), ("--module", " -x"), ("--conda", "--help"), ("--container", "-x"),
    ("--stage-data", "-r"), ("--deepspeed-config", "-x"), ("--accelerate-config", "--cpu"),
])
def test_a_flag_value_that_would_be_an_option_is_refused(capsys, flag, value):
    code, out, err = run_cli(capsys, *PLAN, f"{flag}={value}", "--", "train.py")
    lines = [line for line in err.splitlines() if line.strip() and "HINT" not in line]
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"scaletrain: error: {flag} must be ") and "not start with '-'" in lines[0]


@pytest.mark.parametrize("program, says", [
    (["-c", "import os; os.system('id')"], "the training script '-c' starts with '-'"),
    (["-u"], "the training script '-u' starts with '-'"),
    (["-m", "-c", "x"], "-m needs a module name, got '-c'"),
    (["-m"], "-m needs a module name"),
])
def test_a_program_that_is_an_option_of_python_is_refused(capsys, program, says):
    code, out, err = run_cli(capsys, *PLAN, "--", *program)
    assert code == 2 and out == "" and err.startswith(f"scaletrain: error: {says}"), err
    with pytest.raises(UsageError, match=says):
        scaletrain.submit(cluster="roihu", program=program, gpus=4, account="p")


def test_a_module_after_m_and_a_path_through_dot_slash_still_plan(capsys):
    code, out, err = run_cli(capsys, *PLAN, "--", "-m", "pkg.train", "--epochs", "3")
    assert code == 0 and "python3 -u -m pkg.train --epochs 3" in out, err
    code, out, err = run_cli(capsys, *PLAN, "--", "./-odd.py")
    assert code == 0 and "python3 -u ./-odd.py" in out, err


@pytest.mark.parametrize("keyword, value", [("modules", ["--purge"]), ("conda", "--help"), ("container", "-x"),
                                            ("stage_data", "-r")])
def test_the_api_refuses_the_same_naming_the_keyword(keyword, value):
    with pytest.raises(UsageError, match=f"^submit\\(\\): {keyword} must be .*not start with '-'"):
        scaletrain.submit(cluster="roihu", program=["train.py"], gpus=4, account="p", **{keyword: value})


@pytest.mark.parametrize("flag, value", [("--module", "--purge"), ("--container", "-x")])
def test_env_create_refuses_the_same(capsys, tmp_path, flag, value):
    code, out, err = run_cli(capsys, "env", "create", "--cluster", "lumi", "--dry-run", f"{flag}={value}",
                             str(tmp_path / "venv"))
    assert code == 2 and err.startswith(f"scaletrain: error: {flag} must be "), err
    assert "not start" in err and out == ""


@pytest.mark.parametrize("field, value", [("python", "-c"), ("container", "-x exec"), ("default_image", "-x.sif")])
def test_a_profile_command_or_image_that_starts_with_a_dash_is_refused(field, value):
    root = Path(scaletrain.__file__).parent / "clusters" / "profiles"
    data = tomllib.loads((root / "lumi.toml").read_text())
    data[field] = value
    with pytest.raises(ProfileError, match=f"p.toml: {field} must be "):
        profile_from_dict(data, path="p.toml")
