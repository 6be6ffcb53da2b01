"""A run that finished training always ends (issue 39): a rank stuck in its teardown after the
last step is named with where it waits, stopped after SCALETRAIN_TEARDOWN_TIMEOUT seconds, and
the launch exits 0, the training's result; a clean run says nothing of it.

The issue asks for 20 runs in a row. One `scaletrain run` of two workers takes 6 to 10 s on
the 2-core CI machine (three torch imports), so 20 would add minutes to every CI run: the test
runs the stuck program twice and the clean one once; the 20 runs were done by hand (the
closing note of issue 39 gives the figures).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from workers import launcher_cmd, worker_env

from scaletrain.contract.environ import TEARDOWN_WAIT_VAR

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("teardown_worker.py")


def _run(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess, Path]:
    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    proc = subprocess.run([*launcher_cmd(2, ["--run-dir", str(run_dir)]), str(WORKER), str(out),
                           mode], env=worker_env({TEARDOWN_WAIT_VAR: "2"}),
                          capture_output=True, text=True, timeout=300)
    return proc, out


def _trained(out: Path) -> None:
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] and len(ranks[0]) == 4  # DDP kept both ranks equal


@pytest.mark.parametrize("attempt", [1, 2])
def test_a_rank_stuck_in_teardown_is_named_stopped_and_the_run_succeeds(tmp_path, attempt):
    proc, out = _run(tmp_path, "stuck")
    assert proc.returncode == 0, proc.stderr  # before: waited for ever, printing nothing
    _trained(out)
    lines = [line for line in proc.stderr.splitlines() if "tearing down" in line]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("scaletrain: rank 0 (pid ") and "after 2 s, at " in lines[0]
    assert "store.py" in lines[0] and "in barrier" in lines[0] and "stopped it" in lines[0]
    stack = tmp_path / "run" / "stacks" / "rank-0.txt"
    assert "teardown_worker.py" in stack.read_text()
    assert "ranks stuck in teardown were stopped" in proc.stderr


def test_a_clean_teardown_says_nothing(tmp_path):
    proc, out = _run(tmp_path, "clean")
    assert proc.returncode == 0, proc.stderr
    _trained(out)
    assert "tearing down" not in proc.stderr
    assert not list((tmp_path / "run" / "stacks").glob("*.txt"))  # the empty ones were dropped
