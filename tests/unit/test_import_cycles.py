"""No new import circles in scaletrain: a module never imports, even inside a function or under
``if TYPE_CHECKING:``, one that imports it back. A type-only import does not run, but it is a
dependency all the same: the two modules cannot be read, moved or tested apart.

The parallel strategies import their interface (parallel/strategy.py) and ``setup`` chooses
among them; the runtime's Env of ``init()`` is read through runtime/session.py; the profile and
shell-word types live in clusters/model.py and lint/words.py; launch lines read a protocol of
their own (plan/launchers.py ``LaunchFacts``): no circle is left anywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# None left (the profile's fields are declared in clusters/model.py, which schema.py reads and
# validate.py's shapes serve; launch lines read plan/launchers.py's LaunchFacts, not the planner's
# Plan); a circle added later fails here.
KNOWN: tuple[frozenset[str], ...] = ()


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "scaletrain").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The scaletrain modules ``name`` imports when its code runs."""
    def known(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str | None] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(known(a.name) for a in node.names if a.name.startswith("scaletrain"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base.startswith("scaletrain"):
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else known(base)
                               for a in node.names)
    return {t for t in targets if t is not None and t != name}


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in graph:
        if v not in index:
            visit(v)
    return groups


def test_no_import_circle_beyond_the_known_ones() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["scaletrain.parallel.ddp"] == {"scaletrain.errors", "scaletrain.parallel.options",
                                                "scaletrain.parallel.strategy"}  # the walk sees imports
    new = [sorted(m.removeprefix("scaletrain.") for m in group) for group in _cycles(graph)
           if not any({m.removeprefix("scaletrain.") for m in group} <= k for k in KNOWN)]
    assert new == []


def test_parallel_has_no_import_circle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert not [g for g in _cycles(graph) if any(m.startswith("scaletrain.parallel") for m in g)]


def test_no_circle_between_packages() -> None:
    """One level up: the packages (cli, plan, runtime, checkpoint, ...) import each other in one
    direction only; a module of the package root (errors, contract, fileio) counts as its own."""
    modules = _modules()

    def package(name: str) -> str:
        return name.split(".")[1] if name.count(".") >= 1 else name

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph.setdefault(package(name), set()).update(
            package(t) for t in _imports(name, path, modules) if package(t) != package(name))
    for targets in list(graph.values()):
        for t in targets:
            graph.setdefault(t, set())
    assert {"cli", "runtime", "checkpoint", "plan"} <= set(graph)  # the walk sees the packages
    assert "runtime" in graph["checkpoint"]                          # and their imports
    assert _cycles(graph) == []
