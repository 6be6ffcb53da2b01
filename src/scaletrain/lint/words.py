"""The shell's words as data: a command, its words, their ``$NAME`` expansions, here-documents.

:mod:`scaletrain.lint.shell` produces these from a script's text and
:mod:`scaletrain.lint.script` collects them into a :class:`~scaletrain.lint.script.BatchScript`;
both import this module and neither the other's types (no import circle).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# How a ``$NAME`` appears: "bare" and "double" expand in the shell that reads the line,
# "single" and "escaped" reach the program as the literal text ``$NAME``.
EXPANDS = ("bare", "double")

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\+?=")


@dataclass(frozen=True, kw_only=True)
class Expansion:
    """A ``$NAME``/``${NAME}`` in the text, and how it is quoted (see ``EXPANDS``)."""

    name: str
    quote: str          # "bare" | "double" | "single" | "escaped" | "heredoc"
    line: int

    @property
    def expands(self) -> bool:
        """True when the shell reading this text substitutes the value."""
        return self.quote in EXPANDS or self.quote == "heredoc"


@dataclass(kw_only=True)
class Word:
    """One shell word: its raw text, its value after quote removal, and its expansions."""

    raw: str = ""
    value: str = ""
    line: int = 0
    expansions: list[Expansion] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Heredoc:
    """A here-document attached to a command; ``quoted`` (``<<'EOF'``) means no expansion."""

    body: str
    quoted: bool
    line: int
    expansions: tuple[Expansion, ...]


@dataclass(kw_only=True)
class Command:
    """A simple command: leading ``VAR=value`` assignments, then its words."""

    words: list[Word]
    line: int
    end_line: int
    assignments: list[tuple[str, Word]] = field(default_factory=list)
    heredocs: list[Heredoc] = field(default_factory=list)

    @property
    def argv(self) -> list[str]:
        """The words' values (quotes removed, ``$NAME`` left as text)."""
        return [w.value for w in self.words]


def assignment_value(word: Word) -> Word:
    """The value part of a ``NAME=value`` word, keeping the expansions."""
    _, _, value = word.value.partition("=")
    return Word(raw=word.raw.partition("=")[2], value=value, line=word.line,
                expansions=list(word.expansions))
