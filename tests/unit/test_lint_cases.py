"""Script fixtures: each file names its cluster and the exact findings.

lint_cases/ holds bad scripts (each has an error). lint_real/ holds the shapes found in real
public centre scripts, in our own words: misses that must be found, and correct scripts that
must give no false alarm (an empty ``# expect:``).

Header comments: ``# cluster: NAME`` (or ``none``) and ``# expect: RULE-ID@LINE ...``. The test
compares the full set of (rule, line) pairs, warnings included, so a missing finding and an
extra one both fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scaletrain.lint.engine import lint_file

CASES = Path(__file__).parent / "lint_cases"
FILES = sorted(CASES.glob("*.sh"))
REAL = sorted((Path(__file__).parent / "lint_real").glob("*.sh"))


def _header(path: Path) -> tuple[str | None, set[tuple[str, int]]]:
    text = path.read_text()
    cluster = re.search(r"^# cluster: (\S+)", text, re.M).group(1)  # type: ignore[union-attr]
    expect = re.search(r"^# expect:(.*)$", text, re.M).group(1)     # type: ignore[union-attr]
    pairs = {(item.split("@")[0], int(item.split("@")[1])) for item in expect.split()}
    return (None if cluster == "none" else cluster), pairs


def test_enough_cases() -> None:
    assert 6 <= len(FILES) <= 12


@pytest.mark.parametrize("path", FILES + REAL, ids=[f"{p.parent.name}/{p.stem}" for p in FILES + REAL])
def test_case_findings_exact(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCALETRAIN_CLUSTER", raising=False)
    cluster, expected = _header(path)
    result = lint_file(str(path), cluster=cluster)
    got = {(f.rule, f.line) for f in result.findings}
    assert got == expected, "\n".join(f"{f.line}: {f.severity} {f.rule} {f.message}" for f in result.findings)
    if path in FILES:
        assert result.errors >= 1   # every bad case is a script that must not pass


def test_real_shapes_cover_misses_and_false_alarms() -> None:
    # clean: no finding but, for a retired system's script, the retirement itself
    clean = [p for p in REAL if not {r for r, _ in _header(p)[1]} - {"cluster-retired"}]
    assert len(REAL) >= 12 and len(clean) >= 5
