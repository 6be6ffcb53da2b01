"""What a training program imports, read from its file on the login node (never run).

The check before ``sbatch`` (``scaletrain.envs.check``) asks the job's Python for these names
besides scaletrain and the launcher's package, and the planner refuses a Horovod program where
the centre's stack has no Horovod. Only what the program needs whatever happens counts:

- imports inside a ``try`` whose handlers catch the import's failure are optional, left out;
- the standard library, ``__future__`` and relative imports are left out;
- a module that is a file or package beside the program is the program's own (the program's
  folder is the first entry of ``sys.path`` when it runs), left out;
- once the program changes ``sys.path`` (``sys.path.insert(0, ...)`` to reach a folder of its
  project, ``site.addsitedir``), what it imports below that line may come from there: left out.

Unreadable, too large or not Python (a shell script, ``-m module``): None, "not known here".
"""

from __future__ import annotations

import ast
import os
import sys

MAX_PROGRAM_BYTES = 2 * 1024 * 1024   # a training program, not a data file given by mistake
# handlers that make an import inside their ``try`` optional
_OPTIONAL = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
_STDLIB = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names) | {"__future__"}


def _catches_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        if handler.type is None:
            return True
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(k, ast.Name) and k.id in _OPTIONAL for k in kinds):
            return True
    return False


def _path_changed_at(tree: ast.AST) -> int | None:
    """The first line that changes ``sys.path`` (a call of its methods, an assignment to it or
    to an item of it, ``site.addsitedir``), or None."""
    def is_path(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "path"
                and isinstance(node.value, ast.Name) and node.value.id == "sys")

    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if is_path(node.func.value) or node.func.attr == "addsitedir":
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_path(t) or (isinstance(t, ast.Subscript) and is_path(t.value)) for t in targets):
                lines.append(node.lineno)
    return min(lines) if lines else None


def _imported(tree: ast.AST) -> list[str]:
    """Top-level names of the imports not guarded by a ``try`` that catches their failure and
    not below a change of ``sys.path``."""
    names: list[str] = []
    changed = _path_changed_at(tree)

    def visit(node: ast.AST, guarded: bool) -> None:
        if changed is not None and isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno > changed:
            guarded = True   # may come from the folder the program added
        if isinstance(node, ast.Import) and not guarded:
            names.extend(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not guarded and not node.level and node.module:
            names.append(node.module.split(".")[0])
        if isinstance(node, ast.Try) and _catches_import_error(node):
            for stmt in node.body:
                visit(stmt, True)
            rest: list[ast.AST] = [*node.handlers, *node.orelse, *node.finalbody]
            for other in rest:
                visit(other, guarded)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return names


def program_imports(script: str, *, cwd: str | None = None) -> tuple[str, ...] | None:
    """The third-party top-level modules ``script`` imports (sorted), or None when unknown here."""
    if not script or script == "-m" or not script.endswith(".py"):
        return None
    path = os.path.join(cwd or os.getcwd(), os.path.expanduser(script))
    try:
        if os.path.getsize(path) > MAX_PROGRAM_BYTES:
            return None
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    here = os.path.dirname(os.path.abspath(path))

    def local(name: str) -> bool:
        return os.path.isfile(os.path.join(here, name + ".py")) or os.path.isdir(os.path.join(here, name))

    return tuple(sorted({n for n in _imported(tree) if n not in _STDLIB and not local(n)}))
