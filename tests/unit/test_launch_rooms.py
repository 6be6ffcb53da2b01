"""launch/'s two rooms stay apart, and its patches of torch stay in one module.

- ``scaletrain.launch.inproc`` runs inside the user's processes: of the launcher's side it may
  import only the two modules both sides share (the run folder and the frame test), never the
  agent's own code (which would load it, and whatever it imports, into every worker).
- On the launcher's side, an attribute of a torch module is replaced only in
  ``launch/patches.py``, where each replacement sits beside its feature test.
"""

from __future__ import annotations

import ast
from pathlib import Path

LAUNCH = Path(__file__).resolve().parents[2] / "src" / "scaletrain" / "launch"
SHARED = {"scaletrain.launch.rundir", "scaletrain.launch.frames"}


def _launch_imports(path: Path) -> set[str]:
    """Every ``scaletrain.launch`` module ``path`` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("scaletrain.launch.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "scaletrain.launch":
                found |= {f"scaletrain.launch.{a.name}" for a in node.names}
            elif node.module.startswith("scaletrain.launch."):
                found.add(node.module)
    return found


def test_the_workers_room_imports_nothing_of_the_agents_side():
    files = sorted((LAUNCH / "inproc").rglob("*.py"))
    assert len(files) >= 10
    wrong = {f"{path.relative_to(LAUNCH)} imports {name}"
             for path in files for name in _launch_imports(path)
             if name not in SHARED and not name.startswith("scaletrain.launch.inproc")}
    assert not wrong, sorted(wrong)


def test_the_room_rule_would_catch_an_agent_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from scaletrain.launch import local, rundir\n")
    assert _launch_imports(bad) == {"scaletrain.launch.local", "scaletrain.launch.rundir"}


def _torch_names(tree: ast.AST) -> set[str]:
    """The local names a module binds to torch modules (``import torch.x as y``, ``from torch.x
    import y``), at any depth."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.partition(".")[0] for a in node.names
                      if a.name.split(".")[0] == "torch"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names |= {a.asname or a.name for a in node.names}
    return names


def _torch_replacements(path: Path) -> list[str]:
    """``torch_name.attr = ...`` and ``setattr(torch_name, ...)`` in ``path``."""
    tree = ast.parse(path.read_text())
    torch = _torch_names(tree)
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "setattr" and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        for target in targets:
            base = target
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(target, ast.Attribute) and isinstance(base, ast.Name) and base.id in torch:
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_torch_is_patched_on_the_launchers_side_only_in_patches():
    agent_side = [p for p in sorted(LAUNCH.glob("*.py")) if p.name != "patches.py"]
    assert not [hit for path in agent_side for hit in _torch_replacements(path)]
    assert len(_torch_replacements(LAUNCH / "patches.py")) >= 6   # the rule sees real patches


def test_the_patch_rule_would_catch_a_patch_elsewhere(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import torch.distributed.launcher.api as api\n"
                   "    api.LocalElasticAgent = object\n    setattr(api, 'x', 1)\n")
    assert len(_torch_replacements(bad)) == 2
