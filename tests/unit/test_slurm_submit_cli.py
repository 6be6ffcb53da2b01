"""``scaletrain submit`` without a real Slurm: dry runs, and fake sbatch/scontrol on PATH.

The real thing runs in tests/slurm/test_slurm_submit.py; these check the run folder, the
job id, --wait's exit code and output, and the errors, on any machine.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from scaletrain.cli.main import main
from scaletrain.errors import EXIT_NOT_CHECKED

ARGS = ["submit", "--cluster", "roihu", "--gpus", "2", "--account", "project_1"]


def _fake_slurm(bin_dir: Path, *, job_id: str = "77", state: str = "COMPLETED",
                exit_code: str = "0:0", output: Path | None = None) -> None:
    """sbatch that records its cwd/args and prints a job id; scontrol that reports a final state."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "sbatch").write_text(
        f"#!/bin/sh\necho \"$PWD $*\" > {bin_dir}/sbatch.called\necho '{job_id}'\n")
    out = f" StdOut={output} StdErr={output}" if output else ""
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\n"
        f"echo 'JobId={job_id} JobName=x JobState={state} Reason=None ExitCode={exit_code} "
        f"NodeList=n1{out}'\n")
    for name in ("sbatch", "scontrol"):
        (bin_dir / name).chmod(0o755)


@pytest.fixture
def fake_path(monkeypatch, tmp_path):
    """PATH with only a folder for fake Slurm commands (and sh); in a folder that holds the program."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch\n")   # the check before sbatch reads it
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    return bin_dir


def _hide_real_slurm(bin_dir: Path, monkeypatch) -> None:
    # /usr/bin may hold a real sbatch: keep only sh and friends reachable through bin_dir.
    monkeypatch.setenv("PATH", str(bin_dir))


def test_dry_run_writes_script_and_stops(tmp_path, capsys, fake_path, monkeypatch):
    _hide_real_slurm(fake_path, monkeypatch)
    run = tmp_path / "run"
    code = main([*ARGS, "--run-dir", str(run), "--dry-run", "--", "train.py", "--lr", "0.1"])
    out, err = capsys.readouterr()
    # written, and not checked here: off Roihu, its GPU nodes' (aarch64) set-up and Python cannot run
    assert code == EXIT_NOT_CHECKED, err
    assert "scaletrain: not checked here: " in err
    assert out.strip() == str(run / "job.sh")
    text = (run / "job.sh").read_text()
    assert "#SBATCH --gres=gpu:gh200:2" in text and "train.py --lr 0.1" in text
    assert "dry run" in err and "scaletrain plan: roihu" in err
    assert not (run / "job_id").exists()


def test_default_run_dir_is_timestamped_under_runs(tmp_path, capsys, fake_path, monkeypatch):
    (tmp_path / "my train.py").write_text("")
    assert main([*ARGS, "--dry-run", "--no-check", "--", "my train.py"]) == 0
    out, _ = capsys.readouterr()
    path = Path(out.strip())
    assert path.name == "job.sh"
    assert re.fullmatch(r"runs/\d{8}-\d{6}-my_train", str(path.parent.relative_to(tmp_path)))


def test_submit_prints_job_id_and_runs_sbatch_in_run_dir(tmp_path, capsys, fake_path):
    _fake_slurm(fake_path, job_id="4242")
    run = tmp_path / "run"
    assert main([*ARGS, "--run-dir", str(run), "--", "train.py"]) == 0
    out, err = capsys.readouterr()
    assert out == "4242\n"
    assert (run / "job_id").read_text() == "4242\n"
    assert (fake_path / "sbatch.called").read_text().split() == [str(run.resolve()), "--parsable", "job.sh"]
    assert "submitted job 4242" in err


def test_wait_prints_output_and_returns_job_exit_code(tmp_path, capsys, fake_path):
    job_out = tmp_path / "train-99.out"
    job_out.write_text("hello from the job\n")
    _fake_slurm(fake_path, job_id="99", state="FAILED", exit_code="5:0", output=job_out)
    code = main([*ARGS, "--run-dir", str(tmp_path / "run"), "--wait", "--", "train.py"])
    out, err = capsys.readouterr()
    assert code == 5
    assert out == "99\nhello from the job\n"
    assert "job 99 FAILED (exit code 5)" in err


def test_wait_completed_is_exit_0(tmp_path, capsys, fake_path):
    job_out = tmp_path / "o.out"
    job_out.write_text("ok\n")
    _fake_slurm(fake_path, output=job_out)
    assert main([*ARGS, "--run-dir", str(tmp_path / "run"), "--wait", "--", "train.py"]) == 0
    assert capsys.readouterr().out.endswith("ok\n")


def test_sbatch_missing_is_exit_4_and_keeps_the_script(tmp_path, capsys, fake_path, monkeypatch):
    _hide_real_slurm(fake_path, monkeypatch)
    run = tmp_path / "run"
    assert main([*ARGS, "--run-dir", str(run), "--", "train.py"]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2] == "scaletrain: error: 'sbatch' not found: Slurm's commands are not on PATH"
    assert err[-1].startswith("  HINT: the script is written to") and str(run / "job.sh") in err[-1]
    assert (run / "job.sh").is_file()


def test_sbatch_error_is_one_line_exit_4(tmp_path, capsys, fake_path):
    (fake_path / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: "
        "Invalid account or account/partition combination specified' >&2\nexit 1\n")
    (fake_path / "sbatch").chmod(0o755)
    assert main([*ARGS, "--run-dir", str(tmp_path / "run"), "--", "train.py"]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2] == ("scaletrain: error: sbatch failed: sbatch: error: Batch job submission failed: "
                       "Invalid account or account/partition combination specified")


@pytest.mark.parametrize("extra,needle", [
    (["--output", "x.sh"], "--output is a 'plan' option"),
    (["--json"], "--json is a 'plan' option"),
])
def test_plan_only_flags_are_usage_errors(tmp_path, capsys, fake_path, extra, needle):
    assert main([*ARGS, "--run-dir", str(tmp_path / "r"), *extra, "--", "train.py"]) == 2
    assert needle in capsys.readouterr().err


def test_unwritable_run_dir_is_usage_error(tmp_path, capsys, fake_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([*ARGS, "--run-dir", str(blocker / "sub"), "--dry-run", "--", "train.py"]) == 2
    assert "cannot write the job script" in capsys.readouterr().err


def test_submit_flags_are_plans_plus_four():
    from scaletrain.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    submit, plan = sub.choices["submit"], sub.choices["plan"]

    def flags(p):
        return {o for a in p._actions for o in a.option_strings if o.startswith("--")}

    assert flags(submit) - flags(plan) == {"--run-dir", "--dry-run", "--wait", "--no-check"}
    assert flags(plan) - {"--explain"} <= flags(submit)  # --explain: plan's advice only
    assert "does NOT" in submit.epilog and "cancel" in submit.epilog   # Ctrl-C with --wait


def test_submit_dry_run_imports_no_torch(tmp_path):
    import subprocess
    import sys

    code = ("import sys\nfrom scaletrain.cli.main import main\n"
            f"rc = main(['submit', '--cluster', 'lumi', '--gpus', '16', '--account', 'p', '--run-dir', "
            f"{str(tmp_path / 'r')!r}, '--dry-run', '--', 't.py'])\n"
            "print(rc, 'torch' in sys.modules)\n")
    (tmp_path / "t.py").write_text("import torch\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PATH": "/usr/bin:/bin"})   # no 'module' here: not checked
    assert proc.stdout.split()[-2:] == [str(EXIT_NOT_CHECKED), "False"], proc.stderr
