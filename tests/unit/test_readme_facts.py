"""What the README tells a newcomer is true for a fresh clone: the files it names exist, the commands
it shows exist, it points at nothing outside the repository, and the test count it states is the
count pytest collects (within the rounding the README uses)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# a path in backquotes that starts at one of the repository's top folders
_PATH = re.compile(r"`((?:scripts|examples|docs|constraints|tests|benchmarks|src|\.ci)/[^`\s]*)`")
# a command at the start of a line or after && ; | (comments are cut off first)
_VERB = re.compile(r"(?:^|&&|;|\|)\s*(?:python3? -m )?scaletrain ([a-z]+)\b")
# "about 2,700 unit tests": the figure the README gives for the unit tier
_COUNT = re.compile(r"about ([\d,]+)\s+unit\s+tests")   # a line may break inside it


def _text() -> str:
    return README.read_text(encoding="utf-8")


def test_every_path_the_readme_names_is_in_the_repository() -> None:
    named = sorted(set(_PATH.findall(_text())))
    assert len(named) >= 8, named          # the pattern still finds the README's paths
    missing = [p for p in named if not (REPO / p.rstrip("/")).exists()]
    assert not missing, f"README names files a clone does not have: {missing}"


def test_the_readme_points_at_nothing_outside_the_clone() -> None:
    assert "../shared" not in _text(), "a clone has no ../shared: name what the reader has"


def test_no_figure_is_left_to_fill_in() -> None:
    # figures are written as @@NAME@@ until a measurement gives them; none may reach a reader
    left = sorted(set(re.findall(r"@@[A-Z_]+@@", _text())))
    assert not left, f"README figures never filled in: {left}"


def test_every_verb_the_readme_runs_exists() -> None:
    from scaletrain.cli.main import VERBS

    verbs = set(VERBS)
    lines = [line.split(" #", 1)[0] for block in re.findall(r"```bash\n(.*?)```", _text(), re.S)
             for line in block.splitlines()]
    used = {m for line in lines for m in _VERB.findall(line)}
    assert used, "the pattern finds the README's commands"
    assert used <= verbs, f"README runs verbs scaletrain does not have: {sorted(used - verbs)}"


def test_the_unit_test_count_is_the_collected_count() -> None:
    stated = [int(n.replace(",", "")) for n in _COUNT.findall(_text())]
    assert stated, "the README states the unit tier's size ('about N unit tests')"
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          str(REPO / "tests" / "unit")], cwd=REPO, capture_output=True, text=True, timeout=600)
    found = re.search(r"(\d+) tests? collected", out.stdout)
    if found is None:
        pytest.fail("pytest collected nothing: " + out.stdout[-500:] + out.stderr[-500:])
    collected = int(found.group(1))
    # "about": the README rounds to the hundred, and the tier grows between edits; it gives the
    # count of a bare clone and of one with the centre guides beside it (their jobs add tests)
    assert any(abs(n - collected) <= max(150, collected // 20) for n in stated), (
        f"README says about {stated} unit tests; this checkout collects {collected}")
