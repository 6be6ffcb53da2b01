"""The check before sbatch refuses exactly what would stop the job at its first line, and says
the rest: optional imports are a note, ``--no-check`` / ``check=False`` is the way past it,
``--dry-run`` always writes the run folder and says whether it checked, and a program it cannot
read is refused.

The stand-in login node is test_submit_path's ``cluster`` fixture (a profile without modules, a
fake ``sbatch``, a ``slurm.conf``); the job's Python is this interpreter, which finds scaletrain
and torch through ``PYTHONPATH`` (set here, as the environment sbatch hands the job).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from helpers import run_cli
from test_submit_path import cluster  # noqa: F401  (the stand-in login node)

import scaletrain
from scaletrain.errors import EXIT_NOT_CHECKED, DistEnvError, UsageError

# a program that needs only what this interpreter has whatever happens, and imports the rest on
# some paths only: under TYPE_CHECKING, in the function --wandb calls, in a try that catches
# ImportError, in an if branch
OPTIONAL_ONLY = """\
from __future__ import annotations
import argparse
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import not_installed_typing_only_qq
try:
    import not_installed_fast_path_qq
except ImportError:
    not_installed_fast_path_qq = None


def log_to_wandb(run):
    import not_installed_wandb_like_qq
    not_installed_wandb_like_qq.log(run)


if __name__ == "__main__":
    args = argparse.ArgumentParser().parse_args()
    if torch.cuda.is_available():
        import not_installed_gpu_extra_qq
"""


@pytest.fixture
def login_node(cluster, monkeypatch) -> dict[str, Path]:  # noqa: F811
    """The stand-in login node whose job Python (this one) finds scaletrain and torch."""
    monkeypatch.setenv("PYTHONPATH", str(Path(scaletrain.__file__).parent.parent))
    return cluster


def _submit(capsys, login_node, tmp_path, *flags: str, run: str = "run") -> tuple[int, str, str]:
    return run_cli(capsys, "submit", "--profile", str(login_node["profile"]), "--gpus", "2", *flags,
                   "--run-dir", str(tmp_path / run), "--", "train.py")


def test_optional_imports_submit_and_are_named_in_one_note(capsys, login_node, tmp_path) -> None:
    (tmp_path / "train.py").write_text(OPTIONAL_ONLY)
    code, out, err = _submit(capsys, login_node, tmp_path, "--dry-run")
    assert code == 0, err
    assert "scaletrain: checked here: the job's Python imports scaletrain, torch" in err
    notes = [ln for ln in err.splitlines() if ln.startswith("scaletrain: note: ")]
    assert len(notes) == 1, err
    assert "not_installed_fast_path_qq, not_installed_gpu_extra_qq, not_installed_wandb_like_qq only on some " \
           "paths" in notes[0]
    assert "not_installed_typing_only_qq" not in err          # never imported at run time
    assert out.strip() == str(tmp_path / "run" / "job.sh")
    # and submitted for real: sbatch runs
    code, out, err = _submit(capsys, login_node, tmp_path, run="run2")
    assert code == 0 and out == "4242\n", err
    assert login_node["called"].exists()


def test_a_missing_unconditional_import_is_refused_and_no_check_passes_it(capsys, login_node, tmp_path) -> None:
    (tmp_path / "train.py").write_text("import torch\nimport not_installed_needed_qq\n\n"
                                       "def main():\n    import not_installed_later_qq\n")
    code, out, err = _submit(capsys, login_node, tmp_path)
    assert code == DistEnvError.exit_code, err
    assert "would stop at its first line" in err and "cannot import not_installed_needed_qq" in err
    assert "not_installed_later_qq" not in err.partition("HINT")[0] and out == ""
    assert not login_node["called"].exists() and not (tmp_path / "run").exists()
    # the way past it: submitted, and what it skipped is said, on the console and in job.sh
    code, out, err = _submit(capsys, login_node, tmp_path, "--no-check")
    assert code == 0 and out == "4242\n", err
    assert "scaletrain: warning: not checked (skipped on request)" in err
    assert "not_installed_needed_qq" in err.partition("not checked (skipped on request)")[2]
    header = (tmp_path / "run" / "job.sh").read_text().split("#SBATCH", 1)[0]
    assert "# check before sbatch: not checked (skipped on request)" in header


def test_the_api_has_the_same_way_past_the_check(login_node, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import not_installed_needed_qq\n")
    args = {"cluster": str(login_node["profile"]), "gpus": 2, "program": ["train.py"]}
    with pytest.raises(DistEnvError, match="cannot import not_installed_needed_qq"):
        scaletrain.submit(**args, run_dir=tmp_path / "run")
    with pytest.raises(UsageError, match=r"submit\(\): check must be True or False, got 'no'"):
        scaletrain.submit(**args, run_dir=tmp_path / "run", check="no")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        job = scaletrain.submit(**args, run_dir=tmp_path / "run", check=False)
    assert job.job_id == "4242"
    assert [str(w.message) for w in said if "not checked (skipped on request)" in str(w.message)]


def test_dry_run_without_module_writes_the_folder_and_says_not_checked_here(capsys, login_node, tmp_path) -> None:
    """A laptop or CI: the set-up's 'module load' cannot run here (exit 127), which is not 'would fail'."""
    profile = login_node["profile"]
    profile.write_text(profile.read_text().replace('name = "standin"\n',
                                                   'name = "standin"\nsetup_lines = ["module load pytorch"]\n'))
    (tmp_path / "train.py").write_text("import torch\n")
    code, out, err = _submit(capsys, login_node, tmp_path, "--dry-run")
    assert code == EXIT_NOT_CHECKED, err
    assert "scaletrain: not checked here: a command of the job's set-up is not on this machine (exit 127: " in err
    assert "module: command not found" in err and "scaletrain: error" not in err
    script = tmp_path / "run" / "job.sh"
    assert out.strip() == str(script) and "module load pytorch" in script.read_text()
    assert "# check before sbatch: not checked here:" in script.read_text()
    # skipped on request instead: 0
    code, _, err = _submit(capsys, login_node, tmp_path, "--dry-run", "--no-check", run="run2")
    assert code == 0 and "scaletrain: not checked (skipped on request)" in err, err


def test_dry_run_that_would_fail_writes_the_folder_and_exits_with_the_refusal(capsys, login_node, tmp_path) -> None:
    (tmp_path / "train.py").write_text("import not_installed_needed_qq\n")
    code, out, err = _submit(capsys, login_node, tmp_path, "--dry-run")
    assert code == DistEnvError.exit_code, err
    assert "scaletrain: error: the job would stop at its first line" in err and "HINT:" in err
    script = tmp_path / "run" / "job.sh"
    assert out.strip() == str(script) and script.is_file()
    assert "# check before sbatch: would fail: the job would stop" in script.read_text()
    assert not login_node["called"].exists()


@pytest.mark.parametrize("name, text, why", [
    ("train.py", None, "no such file here"),
    ("train.sh", "#!/bin/bash\nmodule load x\nsrun python train.py $@\n", "is not Python as Python"),
    ("train.py", "import torch\ndef main(:\n", "is not Python as Python"),
])
def test_a_program_the_check_cannot_read_is_refused_unless_told(capsys, login_node, tmp_path, name, text,
                                                               why) -> None:
    (tmp_path / "train.py").unlink(missing_ok=True)
    if text is not None:
        (tmp_path / name).write_text(text)
    args = ["submit", "--profile", str(login_node["profile"]), "--gpus", "2", "--launcher", "mpi"]
    code, out, err = run_cli(capsys, *args, "--run-dir", str(tmp_path / "run"), "--", name)
    assert code == UsageError.exit_code and out == "", err
    assert "the job would stop at its first line: " in err and why in err and "--no-check" in err
    assert not login_node["called"].exists() and not (tmp_path / "run").exists()
    code, out, err = run_cli(capsys, *args, "--no-check", "--run-dir", str(tmp_path / "run"), "--", name)
    assert code == 0 and out == "4242\n", err
    assert "whether the program reads as Python" in err

