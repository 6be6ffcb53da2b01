"""The leaf modules every stage shares: atomic files and the launcher<->runtime environment."""

from __future__ import annotations

import os
import stat

import pytest

from scaletrain.contract import environ
from scaletrain.fileio import atomic_file, atomic_write


def test_atomic_write_replaces_whole_and_keeps_mode(tmp_path):
    target = tmp_path / "job.sh"
    target.write_text("old\n")
    target.chmod(0o750)
    atomic_write(target, "new\n")
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert os.listdir(tmp_path) == ["job.sh"]  # no temporary left behind


def test_atomic_write_unencodable_text_leaves_old_file(tmp_path):
    target = tmp_path / "job.sh"
    target.write_text("precious\n")
    with pytest.raises(UnicodeEncodeError):
        atomic_write(target, "x \udcff y")  # a surrogate from a non-UTF-8 argv byte
    assert target.read_text() == "precious\n"
    assert os.listdir(tmp_path) == ["job.sh"]


def test_atomic_write_new_file_bytes(tmp_path):
    target = tmp_path / "blob"
    atomic_write(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"


def test_port_formula_and_shell_form_agree():
    job = 123456
    assert environ.port_from_job_id(str(job)) == 10000 + job % 20000 == 13456
    # the shell form is the same arithmetic, as bash evaluates it
    expr = environ.PORT_SHELL_EXPR.replace("SLURM_JOB_ID", str(job))
    assert eval(expr[3:-2]) == 13456  # strip "$((" and "))"
    assert environ.port_from_job_id("abc") == environ.port_from_job_id("abc")
    assert environ.PORT_BASE <= environ.port_from_job_id("abc") < environ.PORT_BASE + environ.PORT_SPAN


def test_exit_stopped_does_not_collide_with_cli_codes():
    from scaletrain import errors

    codes = {cls.exit_code for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.ScaletrainError)}
    assert codes == {1, 2, 3, 4}
    assert environ.EXIT_STOPPED not in codes | {0}


def test_atomic_file_streams_and_leaves_the_old_file_on_error(tmp_path):
    target = tmp_path / "weights.pt"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_file(target) as fh:
            fh.write(b"half of the new")
            raise RuntimeError("the writer failed part-way")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["weights.pt"]
    with atomic_file(target) as fh:
        fh.write(b"new ")
        fh.write(b"content")
    assert target.read_bytes() == b"new content"


def test_read_tail_reads_only_the_end_of_a_big_file_and_refuses_what_is_not_one(tmp_path):
    """A job's log or a crash dump can be gigabytes: its end is read, at most the bound."""
    from scaletrain.fileio import read_tail

    big = tmp_path / "job.out"
    big.write_bytes(b"x" * (3 * 2**20) + b"\nRuntimeError: boom\n")
    tail = read_tail(big, limit=2**20)
    assert len(tail) == 2**20 and tail.endswith(b"RuntimeError: boom\n")
    small = tmp_path / "small"
    small.write_bytes(b"abc")
    assert read_tail(small, limit=2**20) == b"abc"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError):
        read_tail(fifo)   # at once, not blocked on a writer that never comes


def test_the_bench_log_tail_finds_the_error_at_the_end_of_a_long_log(tmp_path):
    from scaletrain.bench.scaling_slurm import _log_tail

    log = tmp_path / "bench.out"
    log.write_text("step ok\n" * 3_000_000 + "Traceback ...\nValueError: the last words\n")   # ~24 MB
    assert _log_tail(str(log)) == "ValueError: the last words"
