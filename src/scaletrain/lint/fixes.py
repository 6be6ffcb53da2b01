"""The lines lint's hints propose: a launch line rewritten so that it works, written out whole.

A hint that says what to do in words ("escape it inside the double quotes") fails the user
where the words do not fit the line: ``srun torchrun ... --node_rank=$SLURM_NODEID`` has no
double quotes, and escaping the ``$`` there hands torchrun the text ``$SLURM_NODEID``. Here the
line itself is rewritten: what srun starts becomes ``bash -c "..."``, run by each task, with
the per-task variables escaped (each task's shell expands them) and everything else as the
batch shell expanded it before (a script variable that is not exported still reaches the
program). Where a word cannot be carried into double quotes exactly as it was (a backquote, a
backslash, a quote inside single quotes), there is no line and the hint says it in words.
"""

from __future__ import annotations

import re

from scaletrain.lint.shell import paren_end
from scaletrain.lint.words import Command, Word

# Variables whose value differs per task or per node: they must expand inside the task.
PER_TASK = frozenset({"SLURM_NODEID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_TASK_PID"})
_NAME = re.compile(r"\$(\{)?([A-Za-z_][A-Za-z0-9_]*)(?(1)\})")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PREFIX = {"time", "exec", "nohup", "command"}


def per_task_shell_line(command: Command, *, before: str = "") -> str | None:
    """``command`` (``[time] srun [OPTIONS] PROGRAM ARGS``) as ``srun [OPTIONS] bash -c
    "BEFORE PROGRAM ARGS"``, each per-task variable escaped; None where it is not an srun line
    or a word cannot be carried (see the module docstring)."""
    words = command.words
    start = 0
    while start < len(words) and words[start].value in _PREFIX:
        start += 1
    if start >= len(words) or words[start].value.rsplit("/", 1)[-1] != "srun":
        return None
    split = _after_srun_options(words, start)
    if split >= len(words) or command.assignments or command.heredocs:
        return None
    if any(e.name in PER_TASK for w in words[:split] for e in w.expansions):
        return None   # in srun's own options: no shell of the task reads those
    body = [_in_double_quotes(w.raw) for w in words[split:]]
    if any(part is None for part in body):
        return None
    head = " ".join(w.raw for w in words[:split])
    return f'{head} bash -c "{before}{" ".join(body)}"'  # type: ignore[arg-type]


def _after_srun_options(words: list[Word], start: int) -> int:
    """The index of the first word srun runs (its options written ``--opt=value`` or as flags;
    one taking a separate value is kept with it)."""
    from scaletrain.lint.invocation import srun_option_takes_value

    i = start + 1
    while i < len(words) and words[i].value.startswith("-"):
        if words[i].value == "--":
            return i + 1
        i += 2 if srun_option_takes_value(words[i].value) else 1
    return i


def _escape(text: str) -> str:
    """``text`` (inside double quotes) with each per-task ``$NAME``/``${NAME}`` escaped."""
    return _NAME.sub(lambda m: ("\\" if m.group(2) in PER_TASK else "") + m.group(0), text)


def _in_double_quotes(raw: str) -> str | None:
    """The raw shell word ``raw`` written inside double quotes so that, after the batch shell,
    the task's shell reads the same word; per-task variables escaped. None where it cannot."""
    out: list[str] = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c in "\\`":
            return None
        if c == "'":
            end = raw.find("'", i + 1)
            if end < 0 or any(ch in raw[i + 1:end] for ch in "$`\"\\"):
                return None
            out.append(raw[i:end + 1])   # literal to both shells
            i = end + 1
        elif c == '"':
            end = raw.find('"', i + 1)
            inner = raw[i + 1:end]
            if end < 0 or any(ch in inner for ch in "`\\"):
                return None
            out.append('\\"' + _escape(inner) + '\\"')
            i = end + 1
        elif raw.startswith("$(", i):
            end = paren_end(raw, i + 1)
            seg = raw[i:end]
            names = set(_WORD.findall(seg))
            if names & PER_TASK:   # $((SLURM_NODEID * 4)): only if every name is the task's own
                if any(ch in seg for ch in "\"'`\\") or not seg.startswith("$((") or \
                        any(not (n in PER_TASK or n.startswith("SLURM_")) for n in names):
                    return None
                seg = "\\" + seg
            out.append(seg)
            i = end
        elif c == "$":
            m = _NAME.match(raw, i)
            text = m.group(0) if m else "$"
            out.append(_escape(text))
            i += len(text)
        else:
            out.append(c)
            i += 1
    return "".join(out)
