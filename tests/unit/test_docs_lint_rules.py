"""docs/lint-rules.md lists exactly the rules the linter has, with their current summaries."""

from __future__ import annotations

import re
from pathlib import Path

from scaletrain.lint import RULES

DOC = Path(__file__).resolve().parents[2] / "docs" / "lint-rules.md"


def test_every_rule_is_documented_and_no_stale_ones():
    rows = dict(re.findall(r"^\| `([a-z0-9-]+)` \| (.*?) \|", DOC.read_text(), re.M))
    assert set(rows) == set(RULES), "regenerate docs/lint-rules.md from scaletrain.lint.RULES"
    for rule_id, rule in RULES.items():
        assert rows[rule_id] == rule.summary, rule_id
