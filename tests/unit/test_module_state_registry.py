"""Module state is registered where it is defined (issue 40 item 5): every module global that a
function of scaletrain rebinds (``global``) or mutates in place is declared with
``scaletrain.module_state.register`` by its own module, so the hygiene fixture, which reads that
registry instead of a hand-kept list, cannot miss a new one."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import conftest

import scaletrain
from scaletrain import module_state

SRC = Path(scaletrain.__file__).parent
_MUTATORS = {"append", "add", "update", "clear", "pop", "extend", "insert", "remove", "discard", "setdefault",
             "popitem"}
_CONTAINERS = {"dict", "list", "set", "deque", "OrderedDict", "WeakSet", "WeakValueDictionary"}


def _module_containers(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            value = node.value
            if isinstance(value, (ast.Dict, ast.List, ast.Set)) or (
                    isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _CONTAINERS):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def changed_globals(tree: ast.Module) -> set[str]:
    """The module globals a function of ``tree`` rebinds or mutates in place."""
    containers, found = _module_containers(tree), set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                found |= set(node.names)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _MUTATORS and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id in containers:
                found.add(node.func.value.id)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                found |= {t.value.id for t in targets if isinstance(t, ast.Subscript)
                          and isinstance(t.value, ast.Name) and t.value.id in containers}
    return found


def test_every_global_a_function_changes_is_registered_by_its_module():
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        names = changed_globals(ast.parse(path.read_text(encoding="utf-8")))
        if not names or path.name == "module_state.py":
            continue
        module = "scaletrain." + ".".join(path.relative_to(SRC).with_suffix("").parts)
        importlib.import_module(module)
        registered = {s.name for s in module_state.registered() if s.module == module}
        missing += [f"{module}.{name}" for name in sorted(names - registered)]
    assert missing == []


def test_the_scan_finds_what_the_issue_named():
    found = {(p.relative_to(SRC).as_posix(), n) for p in SRC.rglob("*.py")
             for n in changed_globals(ast.parse(p.read_text(encoding="utf-8")))}
    assert {("checkpoint/comm.py", "_GROUP"), ("runtime/errorhook.py", "_PREVIOUS"),
            ("launch/lean.py", "_STATE")} <= found


def test_the_hygiene_fixture_reads_the_registry():
    import scaletrain.checkpoint.comm as comm
    import scaletrain.launch.lean as lean
    import scaletrain.runtime.errorhook as errorhook

    before = conftest._module_state()
    assert {("scaletrain.checkpoint.comm", "_GROUP"), ("scaletrain.runtime.errorhook", "_PREVIOUS"),
            ("scaletrain.launch.lean", "_STATE")} <= set(before)
    saved = (comm._GROUP, errorhook._PREVIOUS, dict(lean._STATE))
    comm._GROUP = (object(), object())              # type: ignore[assignment]
    errorhook._PREVIOUS = print                     # type: ignore[assignment]
    lean._STATE["skip_teardown"] = not lean._STATE["skip_teardown"]
    assert conftest._restore_module_state(before) == []      # caches and hooks: reset, not failures
    assert (comm._GROUP, errorhook._PREVIOUS, lean._STATE) == saved
