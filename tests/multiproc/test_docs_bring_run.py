"""Every `scaletrain run` line of docs/bring-your-script.md runs as written, on CPU processes,
and none of them trains alone."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from docs_commands import bash_commands
from workers import REPO, worker_env

pytestmark = pytest.mark.multiproc
RUNS = bash_commands(REPO / "docs" / "bring-your-script.md", "run")


@pytest.mark.parametrize("words", RUNS, ids=[" ".join(w[2:]) for w in RUNS])
def test_run_line(words):
    for module in ("accelerate", "lightning"):
        if any(module in w for w in words) and importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[test]')")
    proc = subprocess.run([sys.executable, "-m", "scaletrain", *words[1:]], env=worker_env(),
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "did not form one process group" not in proc.stderr
