"""A command with a here-document as one shell line with the same meaning.

``port`` carries the old script's commands into the new one as ``--setup`` lines, which hold no
newline. ``cmd << EOF`` with its body becomes ``printf '%s\\n' LINE... | cmd``: the same bytes on
the command's standard input, each body line one ``printf`` argument, quoted so that the shell
reads it as the here-document would have been read (literally for ``<<'EOF'``; with ``$NAME``,
``$(...)`` and backquotes expanding in the batch shell for ``<< EOF``; leading tabs dropped for
``<<-``). Pure text in, text out.
"""

from __future__ import annotations

import re
import shlex

_HEREDOC_OP = re.compile(r"<<(-?)[ \t]*(['\"]?)([^\s;&|<>()'\"]+)\2")


def heredoc_line(first: str, body: str, *, quoted: bool) -> str | None:
    """``cmd << EOF`` + its body as one shell line with the same meaning: the body's lines as
    ``printf`` arguments piped into ``cmd`` (single-quoted for ``<<'EOF'``; double-quoted, so
    ``$NAME`` and ``$(...)`` still expand in the batch shell, for ``<< EOF``). None when that
    cannot be done exactly (a line continued with a backslash)."""
    ops = list(_HEREDOC_OP.finditer(first))
    if len(ops) != 1:
        return None
    strip = bool(ops[0].group(1))
    command = (first[:ops[0].start()] + first[ops[0].end():]).strip()
    lines = body.split("\n") if body else []
    if strip:   # <<- drops the leading tabs of every body line
        lines = [ln.lstrip("\t") for ln in lines]
    words = []
    for ln in lines:
        if quoted:
            words.append(shlex.quote(ln))
            continue
        dq = _heredoc_to_dq(ln)
        if dq is None:
            return None
        words.append(dq)
    return f"printf '%s\\n' {' '.join(words)} | {command}" if words else f": | {command}"


def _heredoc_to_dq(line: str) -> str | None:
    # inside an unquoted here-document a backslash escapes only $ ` \ and the newline; inside
    # double quotes also ": a lone " becomes \", and a \" keeps both characters as \\\"
    out, i = [], 0
    while i < len(line):
        c = line[i]
        nxt = line[i + 1] if i + 1 < len(line) else ""
        if c == "\\" and not nxt:
            return None           # a continued line
        if c == "\\" and nxt in "$`\\":
            out.append(c + nxt)
            i += 2
            continue
        if c == "\\" and nxt == '"':
            out.append('\\\\\\"')
            i += 2
            continue
        out.append('\\"' if c == '"' else c)
        i += 1
    return '"' + "".join(out) + '"'
