"""Hostile input to plan, submit and lint: one line + HINT (exit 2), no file lost, nothing hangs.

Each case here was found by trying the CLI as a hostile user would; each failed before the
fix (a traceback, a truncated file, an overwritten run folder, a hang, or a wrong script).
Hangs are bounded by ``_bounded`` (an alarm far above any honest run time), so a regression
fails the test instead of stalling the suite.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Iterator

import pytest

from scaletrain.cli.main import main

PLAN = ["plan", "--cluster", "roihu", "--account", "project_1", "--gpus", "4"]
# run folders, not the check before sbatch (tests/unit/test_submit_check.py): skipped on request
SUBMIT = ["submit", "--cluster", "roihu", "--account", "project_1", "--gpus", "4", "--dry-run", "--no-check"]


@contextlib.contextmanager
def _bounded(seconds: int = 60) -> Iterator[None]:
    """Fail (not hang) when the body runs past ``seconds``: a bound, not a speed target."""
    def on_alarm(signum, frame):  # noqa: ANN001
        raise TimeoutError(f"still running after {seconds} s: unbounded work on hostile input")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with _bounded():
        code = main(argv)
    err = capsys.readouterr().err
    return code, err


def _usage(argv: list[str], capsys: pytest.CaptureFixture[str], *words: str) -> str:
    code, err = _run(argv, capsys)
    assert code == 2, err
    assert "Traceback" not in err and "HINT:" in err, err
    for word in words:
        assert word in err, err
    return err


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    monkeypatch.delenv("SLURM_ACCOUNT", raising=False)


# ---------------------------------------------------------------- data loss

def test_plan_output_keeps_old_file_on_non_utf8_argument(tmp_path: Path, capsys) -> None:
    out = tmp_path / "job.sh"
    out.write_text("my precious script\n")
    bad = os.fsdecode(b"--lr=\xff")          # how Python hands a non-UTF-8 byte in sys.argv
    _usage([*PLAN, "-o", str(out), "--", "train.py", bad], capsys, "UTF-8")
    assert out.read_text() == "my precious script\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh"]   # no temp file left


def test_plan_output_is_replaced_whole(tmp_path: Path, capsys) -> None:
    out = tmp_path / "job.sh"
    out.write_text("old\n")
    code, err = _run([*PLAN, "-o", str(out), "--", "train.py"], capsys)
    assert code == 0, err
    text = out.read_text()
    assert text.startswith("#!") and "#SBATCH" in text
    assert os.access(out, os.X_OK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh"]


def test_submit_non_utf8_argument_writes_nothing(tmp_path: Path, capsys) -> None:
    _usage([*SUBMIT, "--", "train.py", os.fsdecode(b"\xfe\xff")], capsys, "UTF-8")
    assert not (tmp_path / "runs").exists()


def test_two_dry_runs_in_one_second_get_two_folders(tmp_path: Path, capsys, monkeypatch) -> None:
    import datetime as dt

    import scaletrain.slurm.submit as submit

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN001, ANN206
            return cls(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(submit._dt, "datetime", Frozen)
    for args in (["--", "a.py"], ["--", "a.py", "--lr", "0.1"]):
        code, err = _run([*SUBMIT, *args], capsys)
        assert code == 0, err
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2, folders
    texts = [(f / "job.sh").read_text() for f in folders]
    assert "--lr" not in texts[0] and "--lr" in texts[1]


def test_reused_run_dir_is_refused_and_kept(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "myrun"
    code, err = _run([*SUBMIT, "--run-dir", str(run_dir), "--", "a.py"], capsys)
    assert code == 0, err
    (run_dir / "job_id").write_text("12345\n")       # as a real submission leaves it
    first = (run_dir / "job.sh").read_text()
    _usage([*SUBMIT, "--run-dir", str(run_dir), "--", "b.py"], capsys, "--run-dir", str(run_dir))
    assert (run_dir / "job.sh").read_text() == first
    assert (run_dir / "job_id").read_text() == "12345\n"


def test_empty_existing_run_dir_is_used(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    code, err = _run([*SUBMIT, "--run-dir", str(run_dir), "--", "a.py"], capsys)
    assert code == 0, err
    assert (run_dir / "job.sh").is_file()


# ---------------------------------------------------------------- hangs

def test_thirty_digit_gpus_is_refused_at_once(capsys) -> None:
    _usage([*PLAN[:-2], "--gpus", "1" * 30, "--", "train.py"], capsys, "--gpus")


def test_lint_dev_zero_is_refused(capsys) -> None:
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    _usage(["lint", "/dev/zero"], capsys, "not a regular file")


def test_lint_fifo_does_not_block(tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "pipe.sh"
    os.mkfifo(fifo)
    _usage(["lint", str(fifo)], capsys, "not a regular file")


def test_lint_big_valid_script_is_refused_not_cut(tmp_path: Path, capsys) -> None:
    big = tmp_path / "big.sh"
    body = "#!/bin/bash\n#SBATCH --time=01:00:00\n" + 'echo "a line of a long job"\n' * 200_000
    body += "if true; then\n  srun python train.py\nfi\n"   # the end that a cut would lose
    big.write_text(body)
    err = _usage(["lint", str(big)], capsys, "MiB")
    assert "bash-syntax" not in err


# ---------------------------------------------------------------- wrong results

def test_tiny_memory_is_refused_not_rendered_as_all_memory(capsys) -> None:
    _usage([*PLAN, "--mem-per-gpu", "100K", "--", "train.py"], capsys, "--mem-per-gpu")


# --account and --cluster were refused before too (missing account / no cluster); kept as guards
@pytest.mark.parametrize("flag", ["--time", "--mem-per-gpu", "--job-name", "--partition", "--account",
                                  "--cluster", "--container", "--stage-data", "--output"])
def test_empty_values_are_refused(flag: str, capsys) -> None:
    _usage([*PLAN, flag, "", "--", "train.py"], capsys, flag)


@pytest.mark.parametrize("name", ["../../evil", "a/b", "..", "."])
def test_job_name_cannot_leave_the_run_folder(name: str, capsys) -> None:
    _usage([*PLAN, "--job-name", name, "--", "train.py"], capsys, "--job-name")


# 'UNLIMITED' and '1-' were silently taken as the default; the others are guards (refused before too)
@pytest.mark.parametrize("value", ["0", "00:00:00", "UNLIMITED", "1-", "99999999999:00:00"])
def test_time_limit_must_be_a_real_limit(value: str, capsys) -> None:
    _usage([*PLAN, "--time", value, "--", "train.py"], capsys, "--time")


def test_mem_is_not_taken_as_mem_per_gpu(capsys) -> None:
    _usage([*PLAN, "--mem", "64G", "--", "train.py"], capsys, "--mem-per-gpu")


@pytest.mark.parametrize("argv", [
    ["plan", "--clus", "roihu", "--gpus", "4", "--", "train.py"],
    ["lint", "--form", "json", "job.sh"],
    ["run", "--nproc", "2", "train.py"],
    ["clusters", "--js"],
])
def test_no_abbreviations(argv: list[str], capsys) -> None:
    _usage(argv, capsys, "unrecognized")


# ---------------------------------------------------------------- tracebacks

@pytest.mark.parametrize("value", ["1e400", "inf", "nan", "1e16", "-5", "0"])
def test_params_out_of_range(value: str, capsys) -> None:
    _usage([*PLAN, "--params", value, "--", "train.py"], capsys, "--params")


# int() read the Arabic-Indic digit as 3; the other values are guards (refused before too)
@pytest.mark.parametrize("flag", ["--gpus", "--cpus-per-gpu"])
@pytest.mark.parametrize("value", ["", "-1", "0", "4.5", "1e3", "\u0663"])
def test_counts_are_plain_positive_numbers(flag: str, value: str, capsys) -> None:
    _usage([*PLAN[:-2], "--gpus", "4", flag, value, "--", "train.py"], capsys, flag)


# guards: refused before too (by the launcher), now at parse time with a bound
@pytest.mark.parametrize("argv", [
    ["run", "--nproc-per-node", "9" * 40, "train.py"],
    ["run", "--nnodes", "9" * 40, "train.py"],
    ["run", "--master-port", "9" * 5000, "train.py"],
])
def test_run_bounds_numbers(argv: list[str], capsys) -> None:
    _usage(argv, capsys)


def test_lint_non_utf8_path_is_one_line(capsys) -> None:
    _usage(["lint", os.fsdecode(b"job\xff.sh")], capsys, "UTF-8")


def test_library_parsers_refuse_what_the_cli_refuses() -> None:
    """The request parsers behind the CLI types say no on their own too (API callers)."""
    from scaletrain.errors import UsageError
    from scaletrain.plan.request import parse_mem_gb, parse_params

    with pytest.raises(UsageError, match="at least 1M"):
        parse_mem_gb("100K")
    with pytest.raises(UsageError, match="too large"):
        parse_params("1e400")


def test_stage_data_from_a_device_is_refused(capsys) -> None:
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    _usage([*PLAN, "--stage-data", "/dev/zero", "--", "train.py"], capsys, "--stage-data")


def test_stdout_on_a_full_disk_is_one_line(tmp_path: Path) -> None:
    """``plan ... > /dev/full``: a one-line error, no traceback (a real process: real stdout)."""
    import subprocess
    import sys

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "scaletrain", *PLAN, "--", "train.py"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write the output: No space left on device" in proc.stderr


def test_reader_that_goes_away_gives_no_traceback() -> None:
    """``scaletrain clusters | head -c 1`` with a closed pipe: quiet exit, no traceback."""
    import subprocess
    import sys

    import os

    read_end, write_end = os.pipe()
    os.close(read_end)           # the reader is gone before the first write, whatever the timing
    try:
        proc = subprocess.run([sys.executable, "-m", "scaletrain", "clusters", "lumi"], stdout=write_end,
                              stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    err = proc.stderr.decode()
    # 1, not Python's 120 of a failed flush at exit (the output was still in stdout's buffer)
    assert proc.returncode == 1, (proc.returncode, err)
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_plan_output_through_a_symlink_keeps_the_link(tmp_path: Path, capsys) -> None:
    target = tmp_path / "real.sh"
    target.write_text("old\n")
    link = tmp_path / "link.sh"
    link.symlink_to(target)
    code, err = _run([*PLAN, "-o", str(link), "--", "train.py"], capsys)
    assert code == 0, err
    assert link.is_symlink() and target.read_text().startswith("#!")


def test_cli_and_renderer_refuse_the_same_control_characters() -> None:
    """One rule (plan.values.has_control): a C1 control such as NEL is refused when parsed too."""
    import argparse

    from scaletrain.cli.args import text

    for bad in ("a\nb", "a\x1bb", "a\x85b", "a\x7fb"):
        with pytest.raises(argparse.ArgumentTypeError, match="control character"):
            text()(bad)
    assert text()("plain value") == "plain value"
