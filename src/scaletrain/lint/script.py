"""A Slurm batch script as data: ``#SBATCH`` options with line numbers, and its commands.

The shell text is split into commands by ``scaletrain.lint.shell`` (into the word types of
``scaletrain.lint.words``); this module reads the ``#SBATCH`` header the way sbatch does (it stops at the first
line that is neither blank nor a comment; text after an unquoted ``#`` is a comment).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from scaletrain.lint.shell import split_commands
# the word types, importable from here as before (they live in lint/words.py, which the shell
# splitter imports too)
from scaletrain.lint.words import (
    ASSIGN_RE,
    Command,
    Word,
    assignment_value,
)

# Short #SBATCH options and the long name they stand for; aliases folded into one name.
_SHORT = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "t": "time", "p": "partition",
          "A": "account", "G": "gpus", "o": "output", "e": "error", "J": "job-name",
          "C": "constraint", "q": "qos", "w": "nodelist", "x": "exclude", "D": "chdir",
          "d": "dependency", "a": "array", "M": "clusters", "L": "licenses", "S": "core-spec",
          "i": "input", "b": "begin", "F": "nodefile", "k": "no-kill", "s": "oversubscribe",
          "O": "overcommit", "H": "hold", "W": "wait", "h": "help", "V": "version",
          "v": "verbose", "Q": "quiet", "I": "immediate"}
_ALIAS = {"tasks-per-node": "ntasks-per-node"}   # sbatch documents this alias
# Short options that take no value.
_SHORT_FLAGS = set("kOsHWhVvQI")


@dataclass(frozen=True, kw_only=True)
class SbatchOption:
    """One option from a ``#SBATCH`` line: ``name`` is the long name without dashes."""

    name: str
    value: str | None
    line: int
    text: str


@dataclass(kw_only=True)
class BatchScript:
    """A parsed batch script."""

    path: str
    text: str
    lines: list[str]
    shebang: str | None
    options: list[SbatchOption]
    header_end: int                 # number of the first line Slurm stops reading #SBATCH at
    commands: list[Command]
    crlf_line: int | None = None    # first line that ended in \r\n in the file as read

    def option(self, name: str) -> SbatchOption | None:
        """The effective value of a #SBATCH option (the last one wins, as in sbatch)."""
        found = None
        for opt in self.options:
            if opt.name == name:
                found = opt
        return found

    def assignments(self) -> dict[str, list[tuple[Word, Command]]]:
        """Every ``NAME=value`` in the script (plain, ``export`` and ``local``), by name."""
        out: dict[str, list[tuple[Word, Command]]] = {}
        for cmd in self.commands:
            for name, word in cmd.assignments:
                if not cmd.words:
                    out.setdefault(name, []).append((word, cmd))
            if cmd.words and cmd.words[0].value in ("export", "declare", "local", "readonly"):
                for w in cmd.words[1:]:
                    m = ASSIGN_RE.match(w.raw)
                    if m:
                        value_word = assignment_value(w)
                        out.setdefault(m.group(1), []).append((value_word, cmd))
        return out


def parse_sbatch_line(text: str, line: int) -> list[SbatchOption]:
    """Options of one ``#SBATCH`` line; text after an unquoted ``#`` is a comment, as in sbatch."""
    body = text.strip()[len("#SBATCH"):]
    try:
        tokens = shlex.split(body, comments=True)
    except ValueError:
        tokens = body.split("#", 1)[0].split()
    out: list[SbatchOption] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        name: str | None = None
        value: str | None = None
        if tok.startswith("--"):
            name, eq, val = tok[2:].partition("=")
            if eq:
                value = val
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                value = tokens[i + 1]
                i += 1
        elif tok.startswith("-") and len(tok) >= 2:
            letter = tok[1]
            name = _SHORT.get(letter, letter)
            if len(tok) > 2:
                value = tok[2:].lstrip("=")
            elif letter not in _SHORT_FLAGS and i + 1 < len(tokens):
                value = tokens[i + 1]
                i += 1
        if name:
            name = _ALIAS.get(name, name)
            out.append(SbatchOption(name=name, value=value, line=line, text=text.rstrip()))
        i += 1
    return out


def interpreter(shebang: str | None) -> str:
    """The interpreter's name from a ``#!`` line: ``/usr/bin/env -S bash -e`` -> ``bash``."""
    words = (shebang or "").split()
    if not words:
        return ""
    name = words[0].rsplit("/", 1)[-1]
    if name == "env":
        rest = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        name = rest[0].rsplit("/", 1)[-1] if rest else ""
    return name


def is_sbatch_directive(line: str) -> bool:
    """True for a line sbatch reads as a directive (``#SBATCH`` at the very start)."""
    return line.startswith("#SBATCH")


def parse_script(text: str, path: str = "<script>") -> BatchScript:
    """Parse a whole batch script: shebang, the ``#SBATCH`` header, and the commands after it."""
    crlf_line = None
    if "\r\n" in text:
        crlf_line = text[:text.index("\r\n")].count("\n") + 1
        text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    shebang = None
    options: list[SbatchOption] = []
    header_end = len(lines) + 1
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if number == 1 and line.startswith("#!"):
            shebang = line[2:].strip()
            continue
        if not stripped or stripped.startswith("#"):
            if is_sbatch_directive(line):
                options.extend(parse_sbatch_line(line, number))
            continue
        header_end = number
        break
    commands = split_commands(text)
    return BatchScript(path=path, text=text, lines=lines, shebang=shebang, options=options,
                       header_end=header_end, commands=commands, crlf_line=crlf_line)
