"""What a training program imports, read from its file on the login node (never run).

The check before ``sbatch`` (``scaletrain.envs.check``) asks the job's Python for these names
besides scaletrain and the launcher's package, and the planner refuses a Horovod program where
the centre's stack has no Horovod. The imports fall in two kinds:

- needed: what the program imports whatever happens, at module level and not under a condition
  (the body of ``if __name__ == "__main__":`` counts: the program runs as ``__main__``; so does a
  ``try`` whose handlers do not catch the import's failure). A job whose Python lacks one stops
  at its first lines: the check refuses it.
- optional: what it imports only on some paths: inside a function (``import wandb`` in the
  function ``--wandb`` calls), in an ``if``/``else``/``for``/``while`` branch, in a ``try`` that
  catches ``ImportError``. The check names the ones the job's Python lacks in one note, never a
  refusal. Imports under ``if TYPE_CHECKING:`` never run and are left out.

Left out too: the standard library, ``__future__`` and relative imports; a module that is a file
or package beside the program (its folder is the first entry of ``sys.path`` when it runs); and,
once the program changes ``sys.path`` (``sys.path.insert(0, ...)``, ``site.addsitedir``), what
it imports below that line, which may come from there.

A program that cannot be read here as Python (no such file, unreadable, too large, a syntax
error: a shell script given as the program) is ``ProgramImports.unread``, with the reason; the
check refuses it before sbatch, since the job's ``python`` would stop on it as well. ``-m
MODULE`` is read from the folder the job starts in when it is there, else the job's Python is
asked for the module's top-level package (its imports are then not known here).
"""

from __future__ import annotations

import ast
import errno
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from scaletrain.fileio import read_bounded

MAX_PROGRAM_BYTES = 2 * 1024 * 1024   # a training program, not a data file given by mistake
# handlers that make an import inside their ``try`` optional
_OPTIONAL = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
_TRY: tuple[type[ast.stmt], ...] = tuple(t for t in (ast.Try, getattr(ast, "TryStar", None)) if t is not None)
_STDLIB = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names) | {"__future__"}


# the packages whose import makes the program a job of another shape (its own launcher's ranks)
PLAN_DECIDING = ("horovod",)


@dataclass(frozen=True, kw_only=True)
class ProgramImports:
    """What the program file imports: third-party top-level names, sorted, each kind once."""

    needed: tuple[str, ...] = ()      # imported whatever happens (module level, unconditional)
    optional: tuple[str, ...] = ()    # imported on some paths only (functions, branches, try/except ImportError)
    unread: str | None = None         # why the program cannot be read here as Python (then both are empty)
    note: str | None = None           # what is not known here though the program is runnable (-m MODULE)

    @property
    def for_plan(self) -> tuple[str, ...]:
        """What the plan and the check take as the program's needs: ``needed``, and a framework
        that decides how the job is launched wherever the program imports it (``import horovod``
        inside ``main()`` is still a Horovod program: one MPI rank per GPU, Horovod in the job)."""
        deciding = tuple(n for n in self.optional if n in PLAN_DECIDING and n not in self.needed)
        return tuple(sorted(self.needed + deciding))


def _catches_import_error(node: Any) -> bool:
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


def _condition(test: ast.expr) -> str | None:
    """"typing" for ``TYPE_CHECKING`` (never true at run time), "main" for ``__name__ ==
    "__main__"`` (always true in the program the job runs), else None."""
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or \
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
        return "typing"
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        sides = [test.left, *test.comparators]
        if any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and \
                any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides):
            return "main"
    return None


def _imported(tree: ast.AST) -> tuple[list[str], list[str]]:
    """Top-level names of the imports (needed, optional), leaving out those below a change of
    ``sys.path`` and under ``TYPE_CHECKING``."""
    needed: list[str] = []
    optional: list[str] = []
    changed = _path_changed_at(tree)

    def visit_all(nodes: list[ast.stmt] | list[ast.AST], sure: bool) -> None:
        for child in nodes:
            visit(child, sure)

    def visit(node: ast.AST, sure: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if changed is not None and node.lineno > changed:
                return   # may come from the folder the program added
            into = needed if sure else optional
            if isinstance(node, ast.Import):
                into.extend(alias.name.split(".")[0] for alias in node.names)
            elif not node.level and node.module:
                into.append(node.module.split(".")[0])
        elif isinstance(node, ast.If):
            kind = _condition(node.test)
            if kind == "typing":
                visit_all(node.orelse, sure)
            elif kind == "main":
                visit_all(node.body, sure)   # its else never runs in the program the job starts
            else:
                visit_all([*node.body, *node.orelse], False)
        elif isinstance(node, _TRY):
            try_: Any = node   # ast.Try, or ast.TryStar (except*, Python 3.11): the same fields
            visit_all(try_.body, sure and not _catches_import_error(try_))
            visit_all([*try_.handlers, *try_.orelse], False)
            visit_all(try_.finalbody, sure)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.For, ast.AsyncFor,
                               ast.While, ast.Match)):
            visit_all(list(ast.iter_child_nodes(node)), False)   # runs when called, or zero times
        else:   # a module, a class body, a with block: run as they are reached
            visit_all(list(ast.iter_child_nodes(node)), sure)

    visit(tree, True)
    return needed, optional


def _module_file(module: str, folder: str) -> str | None:
    """The file ``python -m module`` runs from ``folder`` (the first entry of its ``sys.path``), or None."""
    base = os.path.join(folder, *module.split("."))
    for path in (base + ".py", os.path.join(base, "__main__.py")):
        if os.path.isfile(path):
            return path
    return None


def program_imports(script: str, args: tuple[str, ...] = (), *, cwd: str | None = None) -> ProgramImports:
    """What ``script`` (``"-m"``: the module ``args[0]``) imports, read from its file, relative
    to ``cwd`` (the folder the job starts in; default this process's)."""
    folder = cwd or os.getcwd()
    if script == "-m":
        module = args[0] if args else ""
        path = _module_file(module, folder) if module else None
        if path is None:
            top = module.split(".")[0]
            if not top.isidentifier():
                return ProgramImports(unread=f"-m {module!r} is not a module name")
            if top in _STDLIB:
                return ProgramImports()
            return ProgramImports(needed=(top,), note=f"the imports of -m {module} are not read here "
                                                      f"(an installed module: no {module} under {folder})")
        here = folder
    elif not script:
        return ProgramImports(unread="no program given")
    else:
        path = os.path.join(folder, os.path.expanduser(script))
        if os.path.isdir(path) and os.path.isfile(os.path.join(path, "__main__.py")):
            path = os.path.join(path, "__main__.py")   # python runs a folder's __main__.py
        here = os.path.dirname(os.path.abspath(path))
    try:
        source = read_bounded(path, MAX_PROGRAM_BYTES)
    except OSError as exc:
        return ProgramImports(unread=_unreadable(path, exc))
    try:
        with warnings.catch_warnings():   # the program's own SyntaxWarnings are its business, not ours
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        where = f", line {exc.lineno}" if exc.lineno else ""
        version = ".".join(map(str, sys.version_info[:2]))
        return ProgramImports(unread=f"{path} is not Python as Python {version} reads it ({exc.msg}{where})")
    except ValueError as exc:   # null bytes: a binary file
        return ProgramImports(unread=f"{path} is not Python ({exc})")

    def third_party(names: list[str]) -> tuple[str, ...]:
        return tuple(sorted({n for n in names if n not in _STDLIB and not _local(n, here)}))

    needed, optional = _imported(tree)
    sure = third_party(needed)
    return ProgramImports(needed=sure, optional=tuple(n for n in third_party(optional) if n not in sure))


def _unreadable(path: str, exc: OSError) -> str:
    """Why ``path`` cannot be read here, in words."""
    if exc.errno == errno.ENOENT:
        return f"{path}: no such file here"
    if exc.errno == errno.EFBIG:
        return f"{path} is larger than {MAX_PROGRAM_BYTES // (1024 * 1024)} MB: not a training program"
    return f"{path} cannot be read here ({exc.strerror or exc})"


def _local(name: str, folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, name + ".py")) or os.path.isdir(os.path.join(folder, name))
