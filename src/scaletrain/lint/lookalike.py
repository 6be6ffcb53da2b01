"""``#SBATCH`` look-alikes: the one detector that lint (rule ``sbatch-unicode``) and ``port`` call.

sbatch reads a directive only where a line starts with the seven ASCII characters ``#SBATCH``,
and reads its options split at ASCII blanks. A line that a person reads as a directive but
that holds another character is ignored by sbatch (``#SВATCH`` with a Cyrillic В, a Greek Α,
a zero-width space before the ``#``), or the option the character sits in is lost (an en dash
for ``--``, a no-break space between options): the job runs without it, and ``port`` would
plan it without it. Both tools report the character by its Unicode name and code point.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from scaletrain.lint.script import BatchScript

DIRECTIVE = "#SBATCH"
_SPACE = "a space"
_DASH = "'-'"
_LETTER = "a Latin letter"
# Letters drawn like those of 'SBATCH' (Unicode's confusables for them: Cyrillic, Greek, Cherokee,
# small capitals); fullwidth and mathematical forms are caught by their NFKC form instead.
_CONFUSABLE = {
    "S": "\u0405\u13da\ua731",
    "B": "\u0412\u0392\u13f4\u0299",
    "A": "\u0410\u0391\u13aa\u1d00",
    "T": "\u0422\u03a4\u13a2\u1d1b",
    "C": "\u0421\u03f9\u13df\u1d04",
    "H": "\u041d\u0397\u13bb\u029c",
}


@dataclass(frozen=True, kw_only=True)
class Lookalike:
    """A character of line ``line`` (column ``column``, from 1) that sbatch does not read as
    the ASCII character it stands in for."""

    line: int
    column: int
    char: str
    stands_for: str          # "'B'", "'-'", "a space", "a Latin letter"; "" for a stray invisible one
    in_prefix: bool          # in the '#SBATCH' itself: sbatch ignores the whole line

    @property
    def name(self) -> str:
        """The character as Unicode names it, with its code point: ``CYRILLIC CAPITAL LETTER VE (U+0412)``."""
        return f"{unicodedata.name(self.char, 'unnamed character')} (U+{ord(self.char):04X})"

    def message(self) -> str:
        """One sentence: which character, where, and what sbatch does with the line."""
        what = ("sbatch does not read this line as a directive, and the job runs without it"
                if self.in_prefix else
                "sbatch does not read the option it is part of, and the job runs without it")
        instead = f"not {self.stands_for}" if self.stands_for else "a character that does not belong there"
        return f"column {self.column} is {self.name}, {instead}: {what}"


HINT = ("retype the line in plain ASCII as '#SBATCH --option=value' (a copy from a web page or a "
        "document brings look-alike characters)")


def _stands_for(ch: str) -> str | None:
    """What a non-ASCII character stands in for, or None where it may be a value's own."""
    if ch.isascii():
        return None
    cat = unicodedata.category(ch)
    if cat in ("Zs", "Cf") or ch in "\u2028\u2029":
        return _SPACE      # no-break, thin, zero-width: not a separator to sbatch
    if cat == "Pd" or ch in "\u2212\ufe63\uff0d":
        return _DASH       # en/em dash, minus sign (pasted from a web page or a word processor)
    if cat.startswith("L") and unicodedata.name(ch, "").startswith(("CYRILLIC", "GREEK")):
        return _LETTER
    return None


def _in_prefix(line: str) -> tuple[int, str, str] | None:
    """A line that reads as ``#SBATCH`` but is not: (index, character, what it stands for).

    Invisible characters and non-ASCII blanks are skipped; a character whose compatibility form
    (NFKC) is the expected ASCII one (a fullwidth ``＃``), or a letter drawn like the expected one
    (``_CONFUSABLE``), matches: a comment in Cyrillic is not a look-alike. The first non-ASCII
    character met is the one reported.
    """
    found: tuple[int, str, str] | None = None
    k = 0
    for i, ch in enumerate(line):
        if k == len(DIRECTIVE):
            break
        want = DIRECTIVE[k]
        if ch == want:
            k += 1
            continue
        if ch.isascii():
            return None
        cat = unicodedata.category(ch)
        if cat in ("Cf", "Zs", "Mn"):    # invisible, a blank that is not ASCII, a combining mark: unseen
            found = found or (i, ch, "")
            continue
        if unicodedata.normalize("NFKC", ch) == want or ch in _CONFUSABLE.get(want, ""):
            found = found or (i, ch, repr(want))
            k += 1
            continue
        return None
    return found if k == len(DIRECTIVE) else None


def _in_options(line: str) -> tuple[int, str, str] | None:
    """In a line that starts with ``#SBATCH``: a look-alike in an option (outside quotes and the
    comment), except a whole word in Cyrillic or Greek, which is a value (a job name)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:                      # inside "..." sbatch keeps every character as the value's
            if ch == "\\" and quote == '"':
                continue
            quote = "" if ch == quote and line[i - 1] != "\\" else quote
            continue
        if ch in "\"'" and i >= len(DIRECTIVE):
            quote = ch
            continue
        if ch == "#" and i > 0 and line[i - 1].isspace():
            return None                # the rest is a comment
        what = _stands_for(ch)
        if what == _LETTER:
            # the name or value it sits in: a Cyrillic job name is a value, "--grеs" a look-alike
            word = (re.search(r"[^\s=:,]*$", line[:i]).group(0)  # type: ignore[union-attr]
                    + re.match(r"[^\s=:,]*", line[i:]).group(0))  # type: ignore[union-attr]
            if not re.search(r"[A-Za-z]", word):
                continue
        if what is not None:
            return i, ch, what
    return None


def line_lookalike(line: str, number: int, *, header: bool = True) -> Lookalike | None:
    """The first look-alike of ``line`` (line ``number``): in the ``#SBATCH`` itself, or, for a
    header line (``header``: before the first command, where sbatch reads), in its options."""
    if line.startswith(DIRECTIVE):
        hit = _in_options(line) if header else None
        prefix = False
    else:
        hit = _in_prefix(line)
        prefix = True
    if hit is None:
        return None
    i, ch, what = hit
    return Lookalike(line=number, column=i + 1, char=ch, stands_for=what, in_prefix=prefix)


def script_lookalikes(script: BatchScript) -> list[Lookalike]:
    """Every look-alike directive of ``script``, in line order; here-document bodies (text for
    another program) are not looked at."""
    skip: set[int] = set()
    for cmd in script.commands:
        for hd in cmd.heredocs:
            skip.update(range(hd.line, hd.line + hd.body.count("\n") + 1))
    out = []
    for number, line in enumerate(script.lines, start=1):
        if number in skip or line.isascii():
            continue
        found = line_lookalike(line, number, header=number < script.header_end)
        if found is not None:
            out.append(found)
    return out
