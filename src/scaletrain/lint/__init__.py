"""`scaletrain lint`: rules that check existing Slurm batch scripts.

Modules: ``script`` (the parsed script and its #SBATCH header), ``shell`` (commands and how each
``$VAR`` is quoted), ``invocation`` (what a command starts: srun, containers, torchrun...),
``job`` (the resource request per node), ``findings`` (rule registry and context), the rules in
``rules_cluster``/``rules_launch``/``rules_program``/``rules_sbatch``/``rules_shell``, ``engine`` (cluster choice,
running the rules) and ``report`` (text and JSON).

Public API (imported lazily, so ``import scaletrain.lint`` stays cheap)::

    from scaletrain.lint import lint_file, lint_text
    result = lint_file("job.sh", cluster="roihu")
    for f in result.findings: print(f.line, f.severity, f.rule, f.message)
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"lint_file": "scaletrain.lint.engine", "lint_text": "scaletrain.lint.engine",
         "LintResult": "scaletrain.lint.engine", "Finding": "scaletrain.lint.findings",
         "RULES": "scaletrain.lint.findings"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        if name == "RULES":
            importlib.import_module("scaletrain.lint.engine")   # registers every rule
        return getattr(module, name)
    raise AttributeError(f"module 'scaletrain.lint' has no attribute {name!r}")
