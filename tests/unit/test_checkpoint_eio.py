"""A disk that returns EIO (issue 39, items 1 and 8): a message naming it, never SIGBUS.

The checksums were read through a memory map, so an I/O error of the disk arrived as SIGBUS
and killed the process with exit 135 and no word. A small LD_PRELOAD shim (``shims/eio.c``,
compiled here) makes every read of one file fail with EIO and its memory maps raise SIGBUS,
as a failing disk does; the load must fall back to the previous checkpoint with one line
naming the I/O error. The same shim under a job's output file: ``logs`` names the file and the
read that failed, not "cannot write the output"; an unreadable commit marker is called
unreadable, not "not valid JSON".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import scaletrain
from scaletrain import fileio
from scaletrain.checkpoint import checksum, layout, verified

SHIM = Path(__file__).parent / "shims" / "eio.c"

_LOAD = """
import sys, torch, scaletrain
torch.manual_seed(0)
model = torch.nn.Linear(4, 3)
step = scaletrain.Checkpointer(sys.argv[1]).load_latest({"model": model})
print("loaded", step, float(model.weight.detach().sum()))
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the EIO shim")
    out = tmp_path_factory.mktemp("shim") / "eio.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(SHIM), "-ldl"],
                   check=True, capture_output=True)
    return out


def _saved(directory: Path) -> dict[int, float]:
    """Steps 1 and 2 of a small model; each step's weight sum."""
    sums = {}
    ckpt = scaletrain.Checkpointer(directory, keep=2)
    for step in (1, 2):
        torch.manual_seed(step)
        model = torch.nn.Linear(4, 3)
        ckpt.save(step, {"model": model})
        sums[step] = float(model.weight.detach().sum())
    ckpt.close()
    return sums


def test_an_io_error_in_the_newest_checkpoint_falls_back_with_one_line(shim, tmp_path):
    sums = _saved(tmp_path / "ck")
    env = dict(os.environ, LD_PRELOAD=str(shim),
               SCALETRAIN_EIO_SUFFIX="/step-00000002/replicated.pt")
    done = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path / "ck")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    word, step, total = done.stdout.split()
    assert (word, int(step)) == ("loaded", 1)
    assert float(total) == pytest.approx(sums[1])
    notes = [line for line in done.stderr.splitlines() if "step-00000002" in line]
    assert len(notes) == 1, done.stderr
    assert "Input/output error" in notes[0] and "resuming from step 1" in notes[0]
    assert "Traceback" not in done.stderr


def test_file_crc_names_an_io_error(shim, tmp_path):
    """The checksum itself, under the shim: an OSError with EIO (a map gave SIGBUS)."""
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(3 << 18))
    probe = ("import sys\nfrom pathlib import Path\nfrom scaletrain.checkpoint import verified\n"
             "try:\n    verified.file_crc(Path(sys.argv[1]))\n"
             "except OSError as err:\n    print(err.errno)\n")
    env = dict(os.environ, LD_PRELOAD=str(shim), SCALETRAIN_EIO_SUFFIX="/data.bin")
    done = subprocess.run([sys.executable, "-c", probe, str(path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "5"), (done.returncode, done.stderr)


@pytest.mark.parametrize("size", [0, 1, (1 << 18) - 1, 1 << 18, (3 << 18) + 7])
def test_file_crc_in_chunks_is_the_whole_file_s(tmp_path, size):
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    for algorithm in ("crc32", "crc32c"):
        if checksum.available(algorithm):
            assert verified.file_crc(tmp_path / "f", algorithm) == \
                checksum._FUNCTIONS[algorithm](data, 0)


def test_an_unreadable_output_file_is_a_read_error_in_logs(shim, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "job_id").write_text("12345\n")
    (run / "slurm-12345.out").write_text("[rank 0] step 1\n" * 100)
    env = dict(os.environ, LD_PRELOAD=str(shim), SCALETRAIN_EIO_SUFFIX="/slurm-12345.out")
    done = subprocess.run([sys.executable, "-m", "scaletrain", "logs", str(run)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert "cannot write the output" not in done.stderr
    assert "slurm-12345.out: cannot read on at byte 0: Input/output error" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_an_unreadable_commit_marker_is_not_called_invalid_json(tmp_path, monkeypatch):
    _saved(tmp_path / "ck")
    real = fileio.read_bounded

    def eio(path, *args, **kwargs):
        if "step-00000002" in str(path):
            raise OSError(5, "Input/output error", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(fileio, "read_bounded", eio)
    (found,) = layout.damaged(tmp_path / "ck")
    assert found[0] == 2 and found[2] == "COMMIT.json: it cannot be read (Input/output error)"
    assert [c.step for c in layout.committed(tmp_path / "ck")] == [1]


def test_a_named_files_io_error_is_not_blamed_on_the_output(monkeypatch, capsys):
    from scaletrain.cli import main as cli

    def fails(args):
        raise OSError(5, "Input/output error", "/data/run/slurm-1.out")

    monkeypatch.setattr(cli, "build_parser", lambda verb=None: _Parser(fails))
    assert cli.main(["status"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "scaletrain: error: /data/run/slurm-1.out: Input/output error"


class _Parser:
    """A parser whose verb is ``func``."""

    def __init__(self, func):
        self.func = func

    def parse_args(self, argv):
        import argparse

        return argparse.Namespace(func=self.func)
