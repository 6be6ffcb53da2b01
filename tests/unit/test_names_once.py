"""Each class name of scaletrain means one thing: no two modules define a class of the same name
(a ``JobRequest`` in plan/ and another in lint/ once sent readers to the wrong one)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "scaletrain"


def _classes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(str(path.relative_to(SRC)))
    return found


def test_no_class_name_is_defined_twice() -> None:
    found = _classes()
    assert "JobRequest" in found and "ScriptJob" in found    # the walk sees the classes
    assert {name: where for name, where in found.items() if len(where) > 1} == {}
