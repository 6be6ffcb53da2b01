"""Files the user names are read by the run folders' rules (issue 39, item 2).

A cluster profile was read with ``Path.read_text``: a FIFO as a profile hung ``clusters`` and
``plan``, a link to ``/dev/zero`` grew without end, a deeply nested TOML ended in a
RecursionError traceback. Every user file (profiles, batch scripts for lint and port, the
program lint reads) now goes through ``fileio.read_user_file``: a regular file, bounded, or
one line naming what it is. The hanging cases run in a subprocess with a timeout and a memory
limit, so that a regression fails instead of stopping the suite.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_cli

from scaletrain.clusters.profile import PROFILE_MAX_BYTES, load_profile
from scaletrain.errors import ProfileError, UsageError
from scaletrain.fileio import read_user_file

_CLI = "from scaletrain.cli.main import main; raise SystemExit(main())"
_PLAN = ("plan", "--gpus", "4", "--account", "def-x", "--", "train.py")


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a child: 60 s and 2 GiB at most (a FIFO hung the old code, /dev/zero grew)."""
    return subprocess.run([sys.executable, "-c", _CLI, *argv], capture_output=True, text=True,
                          timeout=60, preexec_fn=_limited, env={**os.environ, **(env or {})},
                          stdin=subprocess.DEVNULL)


def _hostile(kind: str, path: Path) -> str:
    """Make ``path`` a hostile profile of ``kind``; the words the refusal must contain."""
    if kind == "fifo":
        os.mkfifo(path)
        return "a pipe (FIFO), not a regular file"
    os.symlink("/dev/zero", path)
    return "a device, not a regular file"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_hostile_user_profile_is_refused_by_clusters(tmp_path, kind):
    words = _hostile(kind, tmp_path / "mine.toml")
    done = _cli("clusters", env={"SCALETRAIN_CLUSTERS_DIR": str(tmp_path)})
    assert done.returncode == 2, done.stderr[-500:]
    assert words in done.stderr and "mine.toml" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_hostile_profile_file_is_refused_by_plan(tmp_path, kind):
    words = _hostile(kind, tmp_path / "mine.toml")
    done = _cli(*_PLAN[:1], "--profile", str(tmp_path / "mine.toml"), *_PLAN[1:])
    assert done.returncode == 2, done.stderr[-500:]
    assert words in done.stderr and "Traceback" not in done.stderr


def test_a_deeply_nested_profile_is_one_line(tmp_path, capsys):
    path = tmp_path / "deep.toml"
    path.write_text("name = 'deep'\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    rc, out, err = run_cli(capsys, *_PLAN[:1], "--profile", str(path), *_PLAN[1:])
    assert rc == 2 and "nests arrays or tables too deeply" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2   # message + hint


def test_a_profile_over_the_bound_is_refused_whole(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text("# padding\n" * (PROFILE_MAX_BYTES // 10 + 1))
    with pytest.raises(ProfileError, match=r"big.toml: 1.0 MiB; a cluster profile is read up to 1 MiB"):
        load_profile(str(path))


def test_read_user_file_stops_at_the_bound_and_names_an_io_error(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_user_file(path, what="a file", hint="h", limit=10) == b"x" * 10
    with pytest.raises(UsageError, match="10 bytes|MiB"):
        read_user_file(path, what="a file", hint="h", limit=9)

    def eio(fd: int, n: int) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "read", eio)
    with pytest.raises(UsageError, match="f: cannot read: Input/output error") as info:
        read_user_file(path, what="a file", hint="h", limit=10)
    assert "disk" in (info.value.hint or "")


def test_submit_wait_output_is_streamed_and_a_pipe_or_an_io_error_is_named(tmp_path, capsys):
    """``submit --wait`` read the job's output file whole (a FIFO in its place hung it, an I/O
    error was "not found"): now opened by the run folders' rules and streamed."""
    import io

    from scaletrain.cli import submit

    fifo = tmp_path / "job.out"
    os.mkfifo(fifo)
    assert submit._open_output(str(fifo), wait_s=0) == "cannot be read (a pipe (FIFO), not a regular file)"
    assert submit._open_output(str(tmp_path / "none.out"), wait_s=0) == "not found"

    class Failing(io.BytesIO):
        def read(self, size=-1):
            if self.tell():
                raise OSError(5, "Input/output error")
            return super().read(size)

    data = b"line\n" * 300_000        # more than one block of the stream
    assert submit._copy_output(Failing(data)) == ("cannot read on (Input/output error); the rest is "
                                                  "not shown")
    out = capsys.readouterr().out
    assert 0 < len(out) < len(data) and out == data[:len(out)].decode()
    assert submit._copy_output(io.BytesIO(data)) is None
    assert capsys.readouterr().out == data.decode()
