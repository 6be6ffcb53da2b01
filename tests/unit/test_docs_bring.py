"""Every `scaletrain plan` line of docs/bring-your-script.md runs, and its script lints clean."""

from __future__ import annotations

import subprocess
import sys

import pytest

from docs_commands import bash_commands
from workers import REPO, worker_env

PAGE = REPO / "docs" / "bring-your-script.md"
PLANS = bash_commands(PAGE, "plan")


def test_the_page_shows_plans_for_roihu_and_lumi():
    clusters = {words[words.index("--cluster") + 1] for words in PLANS}
    assert {"roihu", "lumi"} <= clusters
    assert len(bash_commands(PAGE, "run")) >= 5


@pytest.mark.parametrize("words", PLANS, ids=[" ".join(w[2:6]) for w in PLANS])
def test_plan_line_runs_and_lints(words, tmp_path):
    script = tmp_path / "job.sh"
    cmd = [sys.executable, "-m", "scaletrain", *words[1:]]
    cmd[cmd.index("plan") + 1:cmd.index("plan") + 1] = ["--output", str(script)]
    # the user's own config files the line names exist in the folder it runs from (plan checks them)
    for flag in ("--deepspeed-config", "--accelerate-config"):
        if flag in words and ("." in words[words.index(flag) + 1] or "/" in words[words.index(flag) + 1]):
            (tmp_path / words[words.index(flag) + 1]).write_text("{}\n")
    proc = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    lint = subprocess.run([sys.executable, "-m", "scaletrain", "lint", str(script)], env=worker_env(),
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert lint.returncode == 0, lint.stdout + lint.stderr
