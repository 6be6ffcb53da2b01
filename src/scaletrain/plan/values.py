"""The checks and quoting of every value that reaches a generated batch script.

A batch script is read twice: sbatch reads its ``#SBATCH`` header, bash reads the rest. A value
the user typed must mean the same thing to both and can never end a line early, so every value
passes through here on its way out:

- ``check_text`` refuses control characters (a newline in ``--job-name`` would end the
  ``#SBATCH`` header and start a shell command). Used for everything: sbatch values, environment
  values, paths, program arguments.
- ``check_sbatch`` adds per-option rules (an account or partition is one plain word, a mail
  address looks like one, a time is Slurm's syntax) and ``sbatch_word`` quotes the value the way
  sbatch's own ``#SBATCH`` parser reads it (double quotes, backslash escapes; an unquoted ``#``
  starts a comment there).
- Shell words are quoted with ``shlex.quote`` by the renderer; ``check_env_name`` guards the
  left side of ``export NAME=...``.

- The program and its arguments become shell words here too (``program_words``): quoted, or with
  ``$NAME`` left to expand under ``--expand-args`` (``check_expansions`` refuses what would expand
  to the batch shell's value where each task's was meant).
- ``--sbatch OPTION`` names are checked against the options the plan computes (``COMPUTED``).

A ``JobRequest`` is checked once, when it is made (``check_request_values``, called by its
``__post_init__``), so a library caller who builds one by hand is covered as the CLI is; the planner
and the renderer trust it and only quote. The CLI calls the same functions on single flags.
"""

from __future__ import annotations

import re
import shlex
from typing import Iterable

from scaletrain.errors import UsageError
# MAX_COUNT (the most GPUs, nodes or processes one job may count) and the control characters no
# value may hold are the settings' vocabulary's (scaletrain.settings), used here for every value.
from scaletrain.settings import CONTROL as _CONTROL
from scaletrain.settings import MAX_COUNT, has_control

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# One plain word: what Slurm accepts for accounts, partitions, QOS, reservations, user names.
_WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
# Per-option shapes; options not listed only need to be free of control characters.
_SBATCH_SHAPES: dict[str, tuple[re.Pattern[str], str]] = {
    "account": (_WORD, "a project/account name such as project_2001234 or def-someone"),
    "partition": (re.compile(r"^[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*$"), "a partition name such as gpu"),
    "qos": (_WORD, "a QOS name such as normal"),
    "reservation": (re.compile(r"^[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*$"), "a reservation name"),
    "mail-user": (re.compile(r"^[^\s@\"'\\]+@[^\s@\"'\\]+$"), "an e-mail address such as me@uni.fi"),
    "mail-type": (re.compile(r"^[A-Z0-9_]+(,[A-Z0-9_]+)*$", re.I), "e.g. END,FAIL or ALL"),
    "array": (re.compile(r"^[0-9][0-9,:%-]*$"), "e.g. 0-9, 1,3,5 or 0-99%10"),
    "dependency": (re.compile(r"^[a-z_]+(:[0-9_+:]+)?([,?][a-z_]+(:[0-9_+:]+)?)*$|^singleton$"),
                   "e.g. afterok:123456 or singleton"),
    "time": (re.compile(r"^([0-9]+-)?[0-9]+(:[0-9]+){0,2}$"), "HH:MM:SS or D-HH:MM:SS"),
}
SBATCH_SHAPES = _SBATCH_SHAPES   # the request's own setting checks use the same shapes (plan.request)
# Characters that make sbatch's #SBATCH reader split or cut a value unless it is quoted.
_SBATCH_PLAIN = re.compile(r"^[A-Za-z0-9_.,:@%=+/*&|\[\]!<>()-]*$")


def check_text(what: str, value: str) -> str:
    """``value`` unchanged, or UsageError when it holds a control character.

    ``what`` names the value for the message (``"--job-name"``, ``"program argument 3"``).
    """
    if not isinstance(value, str):
        raise UsageError(f"{what} must be text, got {type(value).__name__}", "pass it as a string")
    m = _CONTROL.search(value)
    if m:
        raise UsageError(f"{what} contains a control character ({m.group()!r}): {value[:40]!r}",
                         "remove newlines, tabs and other control characters from it")
    return value


def check_sbatch(option: str, value: str) -> str:
    """``value`` for ``#SBATCH --option``, or UsageError when Slurm would misread it."""
    check_text(f"--{option}", value)
    shape = _SBATCH_SHAPES.get(option)
    if shape is not None and not shape[0].match(value):
        raise UsageError(f"--{option} {value!r} is not a valid value", f"give {shape[1]}")
    return value


def sbatch_word(value: str) -> str:
    """``value`` as sbatch's ``#SBATCH`` reader must see it: plain, or in double quotes.

    sbatch ends a value at unquoted white space, cuts it at an unquoted ``#`` and drops quote
    characters; inside ``"..."`` a backslash escapes the next character. Control characters
    were refused before (``check_text``).
    """
    if _SBATCH_PLAIN.match(value) and value:
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_line(option: str, value: str) -> str:
    """One quoted ``#SBATCH`` line (``value`` "" writes a bare flag); the option and its value
    were checked when the request was made (``check_request_values``) or computed by the planner."""
    if value == "":
        return f"#SBATCH --{option}"
    return f"#SBATCH --{option}={sbatch_word(value)}"


def check_env_name(name: str) -> str:
    """``name`` when it can be exported by bash, else UsageError."""
    if not _ENV_NAME.match(name or ""):
        raise UsageError(f"environment variable name {name!r} is not valid",
                         "use letters, digits and _ (not starting with a digit), e.g. --env NCCL_DEBUG=INFO")
    return name


def check_request_values(*, texts: Iterable[tuple[str, str]], env: Iterable[tuple[str, str]],
                         sbatch: Iterable[tuple[str, str]], extra: Iterable[tuple[str, str]] = (),
                         expanding: Iterable[str] = ()) -> None:
    """Every value a request carries to a script, checked once (UsageError on the first bad one).

    ``texts``: (what, value) pairs free of control characters; ``env``: (NAME, value) pairs bash
    can export; ``sbatch``: (option, value) pairs as an ``#SBATCH`` line takes them; ``extra``: the
    ``--sbatch`` options, whose names must not be the plan's (:func:`check_extra_options`);
    ``expanding``: the program's words under ``--expand-args`` (:func:`check_expansions`).
    """
    for what, value in texts:
        check_text(what, value)
    for name, value in env:
        check_env_name(name)
        check_text(f"--env {name}", value)
    for option, value in sbatch:
        check_sbatch(option, value)
    check_expansions(expanding)
    check_extra_options(extra)


# Options the plan computes, and the flag that sets each (None: the plan decides it alone).
COMPUTED: dict[str, str | None] = {
    "job-name": "--job-name", "account": "--account", "partition": "--partition", "time": "--time",
    "nodes": "--nodes", "ntasks": None, "ntasks-per-node": "--launcher", "tasks-per-node": "--launcher",
    "cpus-per-task": "--cpus-per-gpu", "cpus-per-gpu": "--cpus-per-gpu", "mem": "--mem-per-gpu",
    "mem-per-gpu": "--mem-per-gpu", "mem-per-cpu": "--mem-per-gpu", "gres": "--gpus", "gpus": "--gpus",
    "gpus-per-node": "--gpus", "gpus-per-task": "--gpus", "output": "--log", "error": "--error",
    "chdir": "--chdir", "signal": "--requeue", "requeue": "--requeue", "no-requeue": "--requeue",
    "open-mode": "--requeue",
    "mail-type": "--mail-type", "mail-user": "--mail-user", "array": "--array",
    "constraint": "--constraint", "exclusive": "--exclusive", "dependency": "--dependency",
    "reservation": "--reservation", "qos": "--qos", "wrap": None, "export": "--env",
}
# An option name as an #SBATCH line writes it (after the --).
_OPTION_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


def check_extra_options(extra: Iterable[tuple[str, str]]) -> None:
    """``--sbatch OPTION[=VALUE]``: UsageError for an option the plan computes (naming the flag that
    sets it) or a name that is not an option's."""
    for name, _ in extra:
        name = name.lstrip("-")
        if name in COMPUTED:
            flag = COMPUTED[name]
            raise UsageError(f"--sbatch {name} contradicts what the plan computes",
                             f"use {flag} instead" if flag else "leave it out: the plan sets it")
        if len(name) < 2:
            raise UsageError(f"--sbatch {name}: give the long option name", "e.g. --sbatch begin=now+1hour")
        if not _OPTION_NAME.match(name):
            raise UsageError(f"#SBATCH option {name!r} is not an option name", "e.g. mail-type")


# Set by srun for each task: in the batch shell they are unset or the batch task's own.
PER_TASK_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "RANK", "LOCAL_RANK")
# $NAME, ${NAME}, or arithmetic on names and numbers only ($((SLURM_NNODES * 4))): nothing in
# it can run a command ($(...), backquotes and array subscripts are not among its characters)
_EXPANSION = re.compile(r"\$\(\(([A-Za-z0-9_ +*/%()-]*)\)\)|\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def check_expansions(words: Iterable[str]) -> None:
    """``--expand-args``: UsageError for a per-task value (``$SLURM_PROCID``...) in ``words``, which
    would expand in the batch shell, not in each task."""
    for word in words:
        for m in _EXPANSION.finditer(word):
            task = next((n for n in _names(m) if n in PER_TASK_VARS), None)
            if task:
                raise UsageError(f"--expand-args: {m.group()} would expand in the batch shell, not in each task "
                                 f"(${task})", "read it inside the program (os.environ), or use scaletrain.init()")


def _names(m: re.Match[str]) -> list[str]:
    if m.group(1) is not None:
        return re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(1))
    return [m.group().strip("${}")]


def program_words(script: str, args: Iterable[str], *, expand: bool) -> str:
    """The script and its arguments as shell words: quoted, or with ``$NAME`` left to expand.

    ``--expand-args`` is the explicit way to pass ``$SLURM_JOB_ID`` or ``$LOCAL_SCRATCH``
    through to the program: only ``$NAME``/``${NAME}`` and arithmetic on names and numbers
    (``$((SLURM_NNODES * 4))``) expand, when the job runs, in the batch
    shell before srun starts the tasks (inside double quotes: no word splitting or globbing);
    backquotes, ``$(...)`` and every other character stay literal. Per-task values
    (``$SLURM_PROCID``...) were refused when the request was made (:func:`check_expansions`).
    """
    words = [script, *args]
    if not expand:
        return " ".join(shlex.quote(w) for w in words)
    return " ".join(_expanding(w) for w in words)


def _expanding(word: str) -> str:
    out, pos = [], 0
    for m in _EXPANSION.finditer(word):
        out.append(_dq_literal(word[pos:m.start()]))
        out.append(m.group())
        pos = m.end()
    out.append(_dq_literal(word[pos:]))
    return '"' + "".join(out) + '"'


def _dq_literal(text: str) -> str:
    # inside double quotes only \ $ ` " are special (history expansion is off in scripts)
    return "".join("\\" + c if c in '\\$`"' else c for c in text)


__all__ = ["COMPUTED", "MAX_COUNT", "PER_TASK_VARS", "has_control", "check_text", "check_sbatch", "sbatch_word",
           "sbatch_line", "check_env_name", "check_extra_options", "check_expansions", "check_request_values",
           "program_words"]
