"""Shared words are declared once, in the scaletrain/contract/ package, and imported by writer and reader.

The package has a module per audience: ``environ`` (a launcher and the processes it starts),
``files`` (the run folder's and checkpoint folder's file names) and ``script`` (the words of a
generated script that another verb reads back). The rule for ``SCALETRAIN_*`` names: no string
literal in src/scaletrain outside the package spells one. Docstrings (of a module, class or
function) may name a variable for the reader, and comments are not literals; a message, a help
text or a line of script text builds the name from the contract's constant
(``f"set {DEVICE_VAR}=cpu"``), so renaming a variable is one edit there. The same holds for the
run folder's file names and the batch shell's trap that ``cancel --save`` reads back: the tests
below tie each reader to what its writer actually writes.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from helpers import render_for

from scaletrain.contract import environ, files, script
from scaletrain.checkpoint.stoprecord import mark_superseded, read_stop_record, write_stop_record
from scaletrain.jobs import cancel, runfolder
from scaletrain.slurm import submit

SRC = Path(__file__).resolve().parents[2] / "src" / "scaletrain"
CONTRACT = SRC / "contract"
NAME = re.compile(r"SCALETRAIN_[A-Z_]+")


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelt_names(source: str) -> list[tuple[int, str]]:
    """(line, name) for each SCALETRAIN_* name in a string literal that is not a docstring
    (the literal parts of f-strings included)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return [(node.lineno, name) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            for name in NAME.findall(node.value)]


def test_the_scan_sees_literals_and_f_strings_but_not_docstrings_or_comments():
    source = ('"""Module: SCALETRAIN_DOC."""\n'
              "def f():\n"
              '    """SCALETRAIN_DOC too."""\n'
              '    x = "SCALETRAIN_A"  # SCALETRAIN_COMMENT\n'
              '    return f"set SCALETRAIN_B={x}"\n')
    assert spelt_names(source) == [(4, "SCALETRAIN_A"), (5, "SCALETRAIN_B")]


def test_no_scaletrain_name_is_spelt_outside_the_contract():
    spelt = [f"{path.relative_to(SRC)}:{line}: {name}"
             for path in sorted(SRC.rglob("*.py")) if path.parent != CONTRACT
             for line, name in spelt_names(path.read_text(encoding="utf-8"))]
    assert spelt == []
    declared = [name for path in sorted(CONTRACT.glob("*.py"))
                for _, name in spelt_names(path.read_text(encoding="utf-8"))]
    assert len(declared) >= 20                            # the walk reads the contract itself
    assert len(set(declared)) == len(declared), "a name declared twice"


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def test_each_fact_has_one_module_and_the_package_reexports_nothing():
    """A constant lives in one audience's module; the package's __init__ holds none and imports
    none, so ``from scaletrain.contract import X`` cannot become a second, flat interface."""
    modules = {path.stem: _top_level_names(path) for path in sorted(CONTRACT.glob("*.py"))}
    assert {"environ", "files", "script"} <= set(modules)
    assert modules.pop("__init__") == set()
    init = ast.parse((CONTRACT / "__init__.py").read_text(encoding="utf-8"))
    assert not [n for n in init.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    seen: dict[str, str] = {}
    twice = [f"{name}: {seen[name]} and {mod}" for mod, names in modules.items() for name in sorted(names)
             if seen.setdefault(name, mod) != mod]
    assert twice == []
    assert {"EXIT_STOPPED", "DEVICE_VAR", "port_from_job_id"} <= modules["environ"]   # the walk sees them
    assert {"METRICS_FILE", "JOB_SCRIPT"} <= modules["files"] and "GENERATED_BY" in modules["script"]


def test_the_contract_modules_are_leaves():
    """They import nothing of scaletrain but each other: every side can import them."""
    for path in sorted(CONTRACT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scaletrain"):
                assert node.module.startswith("scaletrain.contract."), f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert not [a.name for a in node.names if a.name.startswith("scaletrain")], path.name


def test_cancel_save_finds_the_trap_that_plan_requeue_writes():
    """cancel --save signals the batch shell exactly when the run's job.sh is a --requeue script
    as plan renders it; a script without --requeue gets the signal in its tasks."""
    requeue = render_for("roihu", gpus=4, requeue=True, time="04:00:00")
    plain = render_for("roihu", gpus=4, time="04:00:00")
    assert script.trap_line(environ.SAVE_AND_STOP_SIGNAL, keep=True) in requeue.splitlines()
    assert cancel.has_save_trap(requeue) and not cancel.has_save_trap(plain)
    for name in (environ.TIME_LIMIT_SIGNAL, environ.PREEMPT_SIGNAL):
        assert script.trap_line(name) in requeue.splitlines()


def test_run_folder_names_read_back_what_submit_and_the_checkpointer_write(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = submit.make_run_dir(None, "train")
    assert folder.parent == tmp_path / files.RUNS_DIR
    submit.write_script(folder, "#!/bin/bash\n")
    submit.write_file(folder, files.JOB_ID_FILE, "123\n")
    step = folder / "out" / f"{files.STEP_DIR_PREFIX}{7:08d}"
    step.mkdir(parents=True)
    (step / files.COMMIT_MARKER).write_text(json.dumps({"step": 7, "files": {}}))
    write_stop_record(folder / "out", reason="time_limit", step=7, log=False)
    run = runfolder.open_run(folder)
    assert (run.job_id, run.script) == ("123", folder / files.JOB_SCRIPT)
    assert run.checkpoints == folder / "out" and runfolder.latest_checkpoint(run.checkpoints) == 7
    assert runfolder.default_runs(Path(files.RUNS_DIR)) == [Path(files.RUNS_DIR) / folder.name]


def test_stop_record_reads_back_what_it_writes(tmp_path):
    path = write_stop_record(tmp_path, reason="preempted", step=5, log=False)
    assert path == tmp_path / files.STOP_RECORD
    record = read_stop_record(tmp_path)
    assert record is not None and (record["reason"], record["step"]) == ("preempted", 5)
    assert mark_superseded(tmp_path, step=9) == path
    assert read_stop_record(tmp_path)["superseded"]["step"] == 9   # type: ignore[index]
    assert runfolder.stop_record(tmp_path) == read_stop_record(tmp_path)
    path.write_bytes(b"\xff not json")
    assert read_stop_record(tmp_path) is None and read_stop_record(None) is None


@pytest.mark.parametrize("name", ["JOB_SCRIPT", "STOP_RECORD", "COMMIT_MARKER", "METRICS_FILE", "SUMMARY_FILE",
                                  "GPU_SAMPLES_PREFIX", "JOB_LOG", "SCALING_REPORT"])
def test_run_folder_names_are_spelt_only_in_the_contract(name):
    """A run-folder file name appears as a literal in contract/files.py alone (docstrings aside; a
    message may still name the file in its prose). The names that are ordinary words too (``runs``, ``job_id``, ``tensorboard``, ``step-``: JSON
    keys, a package, another record's prefix) are held by the read-back test above instead."""
    value = getattr(files, name)
    spelt = []
    for path in sorted(SRC.rglob("*.py")):
        if path == CONTRACT / "files.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstrings(tree)
        spelt += [f"{path.relative_to(SRC)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value == value and id(node) not in skip]
    assert spelt == []
