"""What ``port`` refuses rather than plan a job that is not the old one: a look-alike ``#SBATCH``
line (sbatch ignores it, so the size would be planned without it) and a training program written
into the script itself (``python -c``, ``python - << EOF``) or input and output redirected on the
training line (``> out.log``, ``<< EOF``), for which the new launch line has no place. Each
refusal names the line and says what to do.
"""

from __future__ import annotations

import os
import re

from scaletrain.errors import UsageError
from scaletrain.lint.lookalike import HINT as LOOKALIKE_HINT
from scaletrain.lint.lookalike import script_lookalikes
from scaletrain.lint.script import BatchScript, Command


def inline_program(cmd: Command) -> str | None:
    """How a Python on this line gets its program when it is not a file: ``-c`` or standard input
    (``python -``, or no program word with a here-document), else None."""
    words = cmd.argv
    start = next((j for j, w in enumerate(words) if os.path.basename(w).startswith("python")), None)
    if start is None:
        return None
    for w in words[start + 1:]:
        if w == "-c":
            return "given with -c"
        if w == "-" or w.startswith("<<"):
            return "read from standard input (a here-document)"
        if not w.startswith("-"):
            return None
    return "read from standard input (a here-document)" if cmd.heredocs else None


def refuse_inline(script: BatchScript, path: str, found: list[Command]) -> None:
    """The training program written into the script itself: port carries a program file, and the
    launch line it writes has no place for the text, so it stops rather than drop the program."""
    if not found:
        return
    cmd = found[0]
    end = max([cmd.end_line] + [hd.line + hd.body.count("\n") + 1 for hd in cmd.heredocs])
    raise UsageError(f"{path}:{cmd.line}: the training program is {inline_program(cmd)} (lines {cmd.line}-{end}); "
                     "port carries a program file, not a program written into the script",
                     "save the program as a file (e.g. train.py), launch it as 'srun python train.py', "
                     "and port again")


def refuse_lookalikes(script: BatchScript, path: str) -> None:
    """A look-alike #SBATCH line is one sbatch ignores: planning without it would silently size
    the job otherwise (1 GPU for 4), so port stops, naming the character (lint's detector)."""
    found = script_lookalikes(script)
    if found:
        first = found[0]
        more = f" (and {len(found) - 1} more line(s))" if len(found) > 1 else ""
        raise UsageError(f"{path}:{first.line}: {script.lines[first.line - 1]!r}: {first.message()}{more}",
                         LOOKALIKE_HINT)


def refuse_unreadable(script: BatchScript, path: str) -> None:
    """An #SBATCH count, size or time sbatch cannot read (``--nodes=1e400``) was ported as "not
    stated" (one node): port stops, saying what lint's sbatch-value rule says."""
    from scaletrain.lint.rules_sbatch import PAST_SLURM, unreadable

    for opt in script.options:
        why = unreadable(opt.name, opt.value)
        if why is not None and why != PAST_SLURM:   # a count too large: the planner refuses it against its bound
            raise UsageError(f"{path}:{opt.line}: --{opt.name}={(opt.value or '')[:40]}: {why}; sbatch refuses the "
                             "script as it is", "fix the value (scaletrain lint shows each one), then port the script")


# an unquoted redirection operator at the start of a word: > >> < 2> &> (a quoted '>' is a value)
_REDIRECT = re.compile(r"(\d*[<>]|&>)")


def refuse_redirects(cmd: Command, path: str) -> None:
    """The training line's own redirections (``> out.log 2>&1``, ``< in.txt``, ``<< EOF``) would
    reach the program as arguments of the new launch line, or be lost: port stops instead."""
    found = next((w.raw for w in cmd.words if _REDIRECT.match(w.raw)), None)
    if found is None and cmd.heredocs:
        found = "<<"
    if found is not None:
        raise UsageError(f"{path}:{cmd.line}: the training line redirects the program's input or output "
                         f"({found}...); the launch line port writes has no place for it",
                         "drop the redirection (the job's output goes to its --output file; give input "
                         "as a file argument) and port again")
