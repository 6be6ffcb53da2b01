"""Lines of the old script as one shell line with the same meaning (``--setup`` takes no newline).

Exactly, not by joining at the line breaks: a backslash-newline outside single quotes is removed
(bash removes it; the words on either side join with nothing between), a newline inside quotes
stays in the word, written ``$'\\n'`` between the quoted parts (``python3 -c "...\\n..."`` keeps
its program), comments are dropped, and only a newline that separates commands becomes ``; ``
(or a space after ``then``, ``do``, ``|``...). What cannot be written so (a here-document, a
newline inside ``$(...)`` or backquotes) is None: the caller lists it, with the reason.
Pure: text in, text out.
"""

from __future__ import annotations

import re

from scaletrain.lint.shell import paren_end

# after these a newline is only a space (the command goes on)
_OPENS = re.compile(r"(\bthen|\bdo|\belse|\{|\||&&|;|\()$")
# inside a case block: after 'case WORD in' and after a pattern's ')' the newline is a space too
_CASE_OPENS = re.compile(r"(\bcase\s+\S+\s+in|\))$")
NEWLINE_WORD = "$'\\n'"


class _Unjoinable(Exception):
    """The text holds a construct whose newline cannot be kept on one line."""


def _substitution_end(text: str, i: int) -> int:
    """The index after the ``$(...)`` or backquoted command starting at ``i`` (quote-aware)."""
    if text[i] == "`":
        j = i + 1
        while j < len(text) and text[j] != "`":
            j += 2 if text[j] == "\\" else 1
        return min(j + 1, len(text))
    return paren_end(text, i + 1)


def _join(text: str) -> str:
    out: list[str] = []
    quote = ""
    pending = ""          # the separator a newline between commands becomes, written before the next one
    i, n = 0, len(text)

    def word_start() -> bool:
        return pending != "" or not out or out[-1][-1:] in (" ", "\t", ";", "&", "|", "(", ")")

    while i < n:
        c = text[i]
        if pending and c not in "\n#":
            out.append(pending)
            pending = ""
        nxt = text[i + 1] if i + 1 < n else ""
        if quote == "'":
            out.append("'" + NEWLINE_WORD + "'" if c == "\n" else c)
            quote = "" if c == "'" else quote
            i += 1
            continue
        if c == "\\" and nxt == "\n":          # a continuation (unquoted or in "..."): removed
            i += 2
            continue
        if c == "\\" and not nxt and not quote:
            # the text ends where the command did: a backslash before its last newline (a blank
            # line or the end of the file followed) joined nothing, so it is dropped
            i += 1
            continue
        if c == "\\":
            out.append(c + nxt)
            i += 2
            continue
        if (c == "$" and nxt == "(") or c == "`":
            end = _substitution_end(text, i)
            if "\n" in text[i:end]:
                raise _Unjoinable("a command substitution over several lines")
            out.append(text[i:end])
            i = end
            continue
        if quote == '"':
            out.append('"' + NEWLINE_WORD + '"' if c == "\n" else c)
            quote = "" if c == '"' else quote
            i += 1
            continue
        # unquoted
        if c == "$" and nxt == "'":             # $'...': escapes are its own, \n among them
            j = i + 2
            while j < n and text[j] != "'":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1].replace("\n", "\\n"))
            i = j + 1
            continue
        if c in "'\"":
            quote = c
            out.append(c)
            i += 1
            continue
        if c == "<" and nxt == "<" and text[i + 2:i + 3] != "<":
            raise _Unjoinable("a here-document")
        if c == "#" and word_start():           # a comment: to the end of its line
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if c == "\n":
            so_far = "".join(out).rstrip()
            out = [so_far] if so_far else []
            if so_far:
                in_case = len(re.findall(r"\bcase\b", so_far)) > len(re.findall(r"\besac\b", so_far))
                pending = " " if _OPENS.search(so_far) or (in_case and _CASE_OPENS.search(so_far)) else "; "
            i += 1
            while i < n and text[i] in " \t":    # the next line's indentation
                i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out).strip()


def one_line(text: str) -> str | None:
    """``text`` (one command, or a block of lines) as one shell line with the same meaning, or
    None when that cannot be done exactly (see the module's docstring; ``why_not`` says why)."""
    try:
        return _join(text)
    except _Unjoinable:
        return None


def why_not(text: str) -> str:
    """Why ``one_line(text)`` is None, in a few words ("" when it is not)."""
    try:
        _join(text)
    except _Unjoinable as exc:
        return str(exc)
    return ""
