"""Split shell text into simple commands, recording how every ``$NAME`` is quoted.

This is not a bash parser; it is the part of one the lint rules need. It splits at unquoted
newlines, ``;``, ``&&``, ``||`` and ``|``, joins backslash continuations, keeps ``$(...)`` and
quoted strings inside their word, and reads heredoc bodies (kept on the command, not run as
commands). For each ``$NAME`` it records where it would expand: in the shell reading the line
(bare or inside double quotes) or not at all (single quotes, ``\\$``).
"""

from __future__ import annotations

import re

from scaletrain.lint.words import ASSIGN_RE, NAME_RE, Command, Expansion, Heredoc, Word, assignment_value


def paren_end(s: str, j: int) -> int:
    """From an opening ``(`` at ``j`` of ``s``, the index after its matching ``)``, quote-aware."""
    depth = 0
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == "'":
            k = s.find("'", j + 1)
            j = len(s) if k < 0 else k + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(s)


# Characters that mean nothing to the scanner, taken a run at a time (one step per character
# was most of lint's time): outside quotes, and inside double quotes.
_PLAIN = re.compile(r"[^\\'\"$`\n \t;&|<()#]+")
_PLAIN_QUOTED = re.compile(r'[^\\$`"\n]+')


class _Scanner:
    """Splits shell text into commands. One pass over the characters, tracking quotes."""

    def __init__(self, text: str, first_line: int, heredoc_quote: str = "heredoc") -> None:
        self.s = text
        self.i = 0
        self.line = first_line
        self.heredoc_quote = heredoc_quote
        self.commands: list[Command] = []
        self._words: list[Word] = []
        self._word: Word | None = None
        # the current word's raw text and value, in pieces joined once when it ends: adding to a
        # str attribute copies it, which made a long quoted word (a many-line ``bash -c`` body)
        # cost the square of its length
        self._raw: list[str] = []
        self._val: list[str] = []
        self._cmd_line = first_line
        self._pending_heredocs: list[tuple[str, bool, bool]] = []   # delimiter, quoted, strip tabs
        self._heredocs: list[Heredoc] = []

    # -- word/command bookkeeping -------------------------------------------------------
    def _cur(self) -> Word:
        if self._word is None:
            self._word = Word(line=self.line)
            if not self._words:
                self._cmd_line = self.line
        return self._word

    def _end_word(self) -> None:
        if self._word is not None:
            self._word.raw, self._word.value = "".join(self._raw), "".join(self._val)
            self._raw, self._val = [], []
            self._words.append(self._word)
            self._word = None

    def _end_command(self) -> None:
        self._end_word()
        if self._words or self._heredocs:
            words = self._words
            assignments: list[tuple[str, Word]] = []
            while words and ASSIGN_RE.match(words[0].raw):
                w = words.pop(0)
                assignments.append((ASSIGN_RE.match(w.raw).group(1), assignment_value(w)))  # type: ignore[union-attr]
            self.commands.append(Command(words=words, line=self._cmd_line, end_line=self.line,
                                         assignments=assignments, heredocs=self._heredocs))
        self._words = []
        self._heredocs = []

    def _add(self, raw: str, value: str | None = None) -> None:
        self._cur()
        self._raw.append(raw)
        self._val.append(raw if value is None else value)

    # -- scanning ---------------------------------------------------------------------
    def _peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def _dollar(self, quote: str) -> None:
        """At a ``$``: record the expansion and copy the construct into the current word."""
        s = self.s
        start = self.i
        nxt = self._peek(1)
        if nxt == "{":
            end = s.find("}", self.i)
            end = len(s) if end < 0 else end + 1
            m = NAME_RE.match(s, self.i + 2)
            if m:
                self._cur().expansions.append(Expansion(name=m.group(0), quote=quote, line=self.line))
            self.i = end
        elif nxt == "(":
            self.i = paren_end(s, self.i + 1)
            inner = s[start + 2:self.i - 1]
            for m in re.finditer(r"(\\?)\$\{?([A-Za-z_][A-Za-z0-9_]*)", inner):
                q = "escaped" if m.group(1) else quote
                self._cur().expansions.append(Expansion(name=m.group(2), quote=q, line=self.line))
            if inner.startswith("(") and inner.endswith(")"):   # $((...)): names without $
                for m in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", inner):
                    self._cur().expansions.append(Expansion(name=m.group(0), quote=quote, line=self.line))
        else:
            m = NAME_RE.match(s, self.i + 1)
            if m:
                self._cur().expansions.append(Expansion(name=m.group(0), quote=quote, line=self.line))
                self.i = m.end()
            else:
                self.i += 2 if nxt and nxt in "@*#?$!0123456789-" else 1
        text = s[start:self.i]
        self.line += text.count("\n")
        self._add(text)

    def _read_heredoc_bodies(self) -> None:
        """After a newline: consume the bodies of the heredocs opened on the line before."""
        for delim, quoted, strip in self._pending_heredocs:
            body_start_line = self.line
            body_lines: list[str] = []
            while self.i < len(self.s):
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                ln = self.s[self.i:end]
                self.i = min(end + 1, len(self.s))
                self.line += 1
                if (ln.lstrip("\t") if strip else ln) == delim:
                    break
                body_lines.append(ln)
            body = "\n".join(body_lines)
            exps: list[Expansion] = []
            if not quoted:
                for k, ln in enumerate(body_lines):
                    for m in re.finditer(r"(\\?)\$\{?([A-Za-z_][A-Za-z0-9_]*)", ln):
                        q = "escaped" if m.group(1) else self.heredoc_quote
                        exps.append(Expansion(name=m.group(2), quote=q, line=body_start_line + k))
            hd = Heredoc(body=body, quoted=quoted, line=body_start_line, expansions=tuple(exps))
            if self.commands:
                self.commands[-1].heredocs.append(hd)
        self._pending_heredocs = []

    def _heredoc_start(self) -> None:
        """At an unquoted ``<<``: read the delimiter word."""
        s = self.s
        j = self.i + 2
        strip = False
        if j < len(s) and s[j] == "-":
            strip = True
            j += 1
        while j < len(s) and s[j] in " \t":
            j += 1
        k = j
        while k < len(s) and s[k] not in " \t\n;&|<>)":
            k += 1
        word = s[j:k]
        quoted = any(q in word for q in "'\"\\")
        delim = word.replace("'", "").replace('"', "").replace("\\", "")
        self._add(s[self.i:k])
        self.i = k
        if delim:
            self._pending_heredocs.append((delim, quoted, strip))

    def scan(self) -> list[Command]:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "\\":
                nxt = self._peek(1)
                if nxt == "\n":
                    self.i += 2
                    self.line += 1
                    continue
                if nxt == "$":
                    name = NAME_RE.match(s, self.i + 2)
                    if name:
                        self._cur().expansions.append(Expansion(name=name.group(0), quote="escaped",
                                                                line=self.line))
                self._add(c + nxt, nxt)
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                end = len(s) if end < 0 else end
                inner = s[self.i + 1:end]
                ln, seen = self.line, 0     # lines counted from the previous match on, not from the start
                for m in re.finditer(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", inner):
                    ln += inner.count("\n", seen, m.start())
                    seen = m.start()
                    self._cur().expansions.append(Expansion(name=m.group(1), quote="single", line=ln))
                self._add(s[self.i:end + 1], inner)
                self.line += inner.count("\n")
                self.i = end + 1
            elif c == '"':
                self._cur()
                self._raw.append('"')
                self.i += 1
                while self.i < len(s) and s[self.i] != '"':
                    d = s[self.i]
                    if d == "\\" and self._peek(1) == "\n":
                        self.i += 2
                        self.line += 1
                    elif d == "\\" and self._peek(1) and self._peek(1) in '$`"\\':  # "" at the end is in any str
                        if self._peek(1) == "$":
                            name = NAME_RE.match(s, self.i + 2)
                            if name:
                                self._cur().expansions.append(
                                    Expansion(name=name.group(0), quote="escaped", line=self.line))
                        self._add(s[self.i:self.i + 2], s[self.i + 1])
                        self.i += 2
                    elif d == "$":
                        self._dollar("double")
                    elif d == "`":
                        end = s.find("`", self.i + 1)
                        end = len(s) if end < 0 else end
                        self._add(s[self.i:end + 1])
                        self.line += s[self.i:end + 1].count("\n")
                        self.i = end + 1
                    elif d == "\n":
                        self.line += 1
                        self._add(d)
                        self.i += 1
                    else:   # a run of characters with no meaning inside double quotes (or a lone backslash)
                        run = _PLAIN_QUOTED.match(s, self.i)
                        end = run.end() if run else self.i + 1
                        self._add(s[self.i:end])
                        self.i = end
                self._raw.append('"')
                self.i += 1
            elif c == "$":
                self._dollar("bare")
            elif c == "`":
                end = s.find("`", self.i + 1)
                end = len(s) if end < 0 else end
                self._add(s[self.i:end + 1])
                self.line += s[self.i:end + 1].count("\n")
                self.i = end + 1
            elif c == "#" and self._word is None:
                end = s.find("\n", self.i)
                self.i = len(s) if end < 0 else end
            elif c == "\n":
                self._end_command()
                self.i += 1
                self.line += 1
                if self._pending_heredocs:
                    self._read_heredoc_bodies()
            elif c in " \t":
                self._end_word()
                self.i += 1
            elif c in ";&|":
                self._end_command()
                self.i += 1
                while self._peek() in (";", "&", "|"):
                    self.i += 1
            elif c == "<" and self._peek(1) == "<" and self._peek(2) != "<":
                self._heredoc_start()
            elif c in "()" and self._word is None:
                # subshell/grouping parentheses around commands: separators for our purpose
                self._end_command()
                self.i += 1
            else:   # a run of plain characters (at least this one: a '#' or '(' inside a word)
                run = _PLAIN.match(s, self.i)
                end = run.end() if run else self.i + 1
                self._add(s[self.i:end])
                self.i = end
        self._end_command()
        return self.commands


def split_commands(text: str, first_line: int = 1, heredoc_quote: str = "heredoc") -> list[Command]:
    """The simple commands in ``text``; line numbers start at ``first_line``."""
    return _Scanner(text, first_line, heredoc_quote).scan()


