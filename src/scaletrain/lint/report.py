"""Render lint results: one line per finding (text) or one JSON document.

Text: ``FILE:LINE: error|warning RULE-ID message HINT: fix`` -- the format compilers use, so
editors and CI annotate the line.
"""

from __future__ import annotations

from typing import Sequence

from scaletrain.fileio import json_text
from scaletrain.lint.engine import LintResult

JSON_VERSION = 1


def format_text(results: Sequence[LintResult]) -> str:
    """Every finding of every file, one line each (empty string when there is none)."""
    lines = [f"{r.path}:{f.line}: {f.severity} {f.rule} {f.message} HINT: {f.hint}"
             for r in results for f in r.findings]
    return "\n".join(lines) + ("\n" if lines else "")


def format_summary(results: Sequence[LintResult]) -> str:
    """One line for stderr: counts and the cluster(s) used."""
    errors = sum(r.errors for r in results)
    warnings = sum(r.warnings for r in results)
    clusters = sorted({f"{r.cluster} ({r.cluster_source})" if r.cluster
                       else f"{' or '.join(r.candidates)} ({r.cluster_source})" if r.candidates
                       else "none (cluster-independent rules only)" for r in results})
    return (f"scaletrain lint: {len(results)} file(s), {errors} error(s), {warnings} warning(s); "
            f"cluster: {', '.join(clusters)}")


def to_json(results: Sequence[LintResult]) -> dict:
    """The JSON document (a dict) for ``--format json``."""
    return {
        "version": JSON_VERSION,
        "files": [{"path": r.path, "cluster": r.cluster, "cluster_source": r.cluster_source,
                   "candidates": list(r.candidates), "errors": r.errors, "warnings": r.warnings}
                  for r in results],
        "findings": [{"file": r.path, "line": f.line, "severity": f.severity, "rule": f.rule,
                      "message": f.message, "hint": f.hint} for r in results for f in r.findings],
        "summary": {"files": len(results), "errors": sum(r.errors for r in results),
                    "warnings": sum(r.warnings for r in results)},
    }


def format_json(results: Sequence[LintResult]) -> str:
    """``to_json`` as indented text with a final newline."""
    return json_text(to_json(results), indent=2) + "\n"
