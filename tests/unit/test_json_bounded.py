"""Every JSON scaletrain reads goes through one parser bounded in size and depth (scaletrain.jsonfile).

Python's parser recursed once per level: 100,000 nested brackets in a COMMIT.json, a
scaling.json, a summary.json or a metrics.jsonl line ended in RecursionError wherever it was read
(``load_latest``, ``report``, ``plan --explain``). Now a text deeper than 64 levels is "not valid
JSON" at the parser, which every reader already answers in one line; and no module parses JSON
on its own (a test holds to it).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaletrain import fileio, jsonfile
from scaletrain.cli.main import main

SRC = Path(__file__).resolve().parents[2] / "src" / "scaletrain"
DEEP = "[" * 100_000 + "]" * 100_000
PLAN = ["plan", "--cluster", "juwels-booster", "--gpus", "16", "--account", "p", "--time", "01:00:00"]


@pytest.mark.parametrize("text", [DEEP, "[" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000,
                                  "[" * 65 + "]" * 65])
def test_too_deep_is_not_valid_json(text):
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        jsonfile.loads(text)


def test_brackets_inside_strings_do_not_nest_and_64_levels_parse():
    assert jsonfile.loads(json.dumps({"msg": "[" * 1000 + "{" * 1000}))["msg"].startswith("[[[")
    assert jsonfile.loads("[" * 64 + "]" * 64) == json.loads("[" * 64 + "]" * 64)
    assert jsonfile.loads('["a\\"[[[", {"b": [1, 2]}]') == ['a"[[[', {"b": [1, 2]}]


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**63 - 1), 2**63 - 1) | st.text()
                    | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                    max_leaves=40))
def test_what_the_standard_parser_reads_within_the_bound_reads_alike(value):
    """Within the bounds (depth, and numbers a file of ours can hold: 64-bit integers, finite floats)."""
    text = json.dumps(value)
    assert jsonfile.loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["9223372036854775808", "-9223372036854775808", "1e400", "-1e400", "NaN",
                                  "Infinity", '{"step": ' + "9" * 400 + "}"])
def test_a_number_no_file_of_ours_holds_is_refused(text):
    with pytest.raises(ValueError):
        jsonfile.loads(text)


def test_size_bound_and_repeated_keys():
    with pytest.raises(jsonfile.JSONLimit, match="more than"):
        jsonfile.loads("[" + "1," * 100 + "1]", max_bytes=100)
    assert jsonfile.loads('{"a": 1, "a": 2}') == {"a": 2}
    with pytest.raises(ValueError, match="appears twice"):
        jsonfile.loads('{"a": 1, "a": 2}', unique_keys=True)


def test_readers_of_run_files_answer_none_not_recursion(tmp_path):
    (tmp_path / "deep.json").write_text(DEEP)
    assert fileio.read_json_object(tmp_path / "deep.json") is None
    (tmp_path / "m.jsonl").write_text(DEEP + "\n" + json.dumps({"type": "step", "step": 1}) + "\n")
    assert list(fileio.json_lines(tmp_path / "m.jsonl")) == [{"type": "step", "step": 1}]


@pytest.mark.parametrize("name", ["summary.json", "scaling.json"])
def test_plan_explain_says_one_line_of_a_deep_report(tmp_path, capsys, name):
    (tmp_path / name).write_text('{"kind": "scaling", "rows": ' + DEEP + "}")
    assert main([*PLAN, "--explain", str(tmp_path / name), "--", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    said = [line for line in err.splitlines() if "error" in line]
    assert len(said) == 1 and "nested deeper than 64 levels" in said[0], err


def test_no_module_parses_json_but_the_bounded_one():
    """``json.load``/``json.loads``/``JSONDecoder`` outside scaletrain.jsonfile: each a reader
    that a deep or huge file would end with RecursionError."""
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "jsonfile.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("load", "loads", "JSONDecoder") \
                    and isinstance(node.value, ast.Name) and node.value.id == "json":
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []
