"""After a failure the user reads one line that names the cause and the fix: programs shaped like
the centre guides' and the common course programs (tests/multiproc/hints_corpus), run as users
run them, under ``scaletrain run --cpu`` and ``--emulate slurm``.

Each launch is checked for its hint, the excerpt of the failed rank (the program's own line and
the error, once), the console's prefixes (one per line, a progress bar cut into lines), and a
clean end (no process "left running" after an ``mp.spawn`` program that ended well).
"""

from __future__ import annotations

import importlib.util
import re

import pytest
from helpers import free_port
from workers import REPO, run_workers

pytestmark = pytest.mark.multiproc
CORPUS = REPO / "tests" / "multiproc" / "hints_corpus"


def _run(program: str, *args: str, nproc: int = 2, launcher_args: tuple[str, ...] = ("--cpu",)):
    return run_workers(CORPUS / program, nproc=nproc, args=args, launcher_args=list(launcher_args),
                       timeout=240)


def _hint(stderr: str) -> str:
    return stderr.split("  HINT: ", 1)[1].splitlines()[0]


def _excerpt(stderr: str) -> list[str]:
    """The block the launcher prints before its error line."""
    block = stderr.split("scaletrain: error:", 1)[0].splitlines()
    start = max(i for i, line in enumerate(block) if line.startswith("scaletrain: "))
    return block[start:]


def test_a_missing_srun_variable_read_with_environ_get_is_named():
    """The Alliance guide's int(os.environ.get("SLURM_LOCALID")) under a plain run: a TypeError
    on None, which had the generic hint."""
    proc = _run("alliance_slurm_ids.py")
    assert proc.returncode == 1, proc.stderr
    hint = _hint(proc.stderr)
    assert hint.startswith("the program reads SLURM_LOCALID, which srun sets and this run did not"), hint
    assert "'scaletrain run --emulate slurm'" in hint
    excerpt = _excerpt(proc.stderr)
    assert re.match(r"scaletrain: rank [01] failed at tests/multiproc/hints_corpus/alliance_slurm_ids\.py:\d+ "
                    r"in main:$", excerpt[0]), excerpt
    assert excerpt[1:] == ['  |     local_rank = int(os.environ.get("SLURM_LOCALID"))',
                           "  | TypeError: int() argument must be a string, a bytes-like object or a real "
                           "number, not 'NoneType'"]


def test_a_variable_read_after_init_process_group_is_named_and_printed_once():
    """After init_process_group torch prefixes the traceback with [rank0]:; the hint was the
    generic one, the lines read '[rank 0] [rank0]: ...' and rank 0's traceback came twice."""
    proc = _run("course_after_init.py")
    err = proc.stderr
    assert proc.returncode == 1, err
    assert _hint(err).startswith("the program reads SLURM_LOCALID, which srun sets and this run did not: "
                                 "run it with 'scaletrain run --emulate slurm'")
    assert "[rank0]:" not in err and "[rank1]:" not in err
    assert err.count("[rank 0] Traceback (most recent call last):") == 1
    assert err.count("Traceback") == 2   # each rank's, once, as it came
    excerpt = _excerpt(err)
    assert excerpt[1:] == ['  |     local_rank = int(os.environ["SLURM_LOCALID"])',
                           "  | KeyError: 'SLURM_LOCALID'"], excerpt
    assert "in setup:" in excerpt[0] and "<frozen" not in "\n".join(excerpt)


def test_torchruns_variable_under_emulated_srun_is_named():
    proc = _run("course_getenv.py", launcher_args=("--cpu", "--emulate", "slurm"))
    assert proc.returncode == 1, proc.stderr
    hint = _hint(proc.stderr)
    assert hint.startswith("the program reads LOCAL_RANK, which torchrun sets and this run did not: "
                           "--emulate slurm gives the program that launcher's view"), hint
    assert _excerpt(proc.stderr)[1] == '  |     local_rank = int(os.getenv("LOCAL_RANK"))'


def test_the_same_program_runs_under_the_launcher_it_was_written_for():
    proc = _run("course_getenv.py")
    assert proc.returncode == 0, proc.stderr
    assert "[rank 0] training on 2 processes" in proc.stdout


@pytest.mark.parametrize("cpu", [True, False])
def test_a_single_process_program_is_told_so(cpu):
    """Its hint sent the user to 'the condition around its init_process_group call', which the
    program does not have."""
    proc = _run("single_gpu.py", launcher_args=("--cpu",) if cpu else ())
    assert proc.returncode == 0, proc.stderr
    hint = proc.stderr.split("\nHINT: ", 1)[1].splitlines()[0]
    assert hint.startswith("the program never calls init_process_group"), hint
    assert "--nproc-per-node 1" in hint and "condition around" not in hint


def test_a_clean_spawn_program_ends_without_stopping_anything():
    proc = _run("spawn_tutorial.py", str(free_port()), nproc=1, launcher_args=())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Finished running basic DDP example") == 2
    assert "left running" not in proc.stderr


def test_a_progress_bar_is_one_line_per_redraw():
    """A bar redrawn after \\r was one line of every state in the log (16 kB for Lightning's)."""
    proc = _run("progress_bar.py", nproc=1, launcher_args=())
    assert proc.returncode == 0, proc.stderr
    bars = [line for line in proc.stderr.splitlines() if "Epoch 0:" in line]
    assert len(bars) == 40, proc.stderr[-2000:]
    assert all(line.startswith("[rank 0] Epoch 0: ") and "\r" not in line for line in bars)
    assert bars[-1].startswith("[rank 0] Epoch 0: 100%|####################| 40/40")


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed")
def test_lightnings_progress_bar_is_cut_into_lines():
    proc = _run("lightning_bar.py", nproc=1, launcher_args=())
    assert proc.returncode == 0, proc.stderr
    bars = [line for line in (proc.stdout + proc.stderr).splitlines() if "Epoch 0:" in line]
    assert len(bars) > 2, (proc.stdout + proc.stderr)[-3000:]
    assert max(len(line) for line in bars) < 300
    assert all(line.startswith("[rank 0] ") for line in bars)


def test_torchs_warning_names_the_programs_line_under_cpu():
    """It named scaletrain's cpu_map.py, the frame the --cpu mapping puts in between."""
    proc = _run("copy_construct_warning.py", nproc=1)
    assert proc.returncode == 0, proc.stderr
    warning = next(line for line in proc.stderr.splitlines() if "To copy construct" in line)
    assert "hints_corpus/copy_construct_warning.py:7: UserWarning" in warning, warning
    assert "cpu_map" not in proc.stderr
