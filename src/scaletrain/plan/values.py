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

A ``JobRequest`` is checked once, when it is made (``check_request_values``, called by its
``__post_init__``), so a library caller who builds one by hand is covered as the CLI is; the planner
and the renderer trust it and only quote. The CLI calls the same functions on single flags.
"""

from __future__ import annotations

import re
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
                         sbatch: Iterable[tuple[str, str]]) -> None:
    """Every value a request carries to a script, checked once (UsageError on the first bad one).

    ``texts``: (what, value) pairs free of control characters; ``env``: (NAME, value) pairs bash
    can export; ``sbatch``: (option, value) pairs as an ``#SBATCH`` line takes them.
    """
    for what, value in texts:
        check_text(what, value)
    for name, value in env:
        check_env_name(name)
        check_text(f"--env {name}", value)
    for option, value in sbatch:
        check_sbatch(option, value)


__all__ = ["MAX_COUNT", "has_control", "check_text", "check_sbatch", "sbatch_word", "sbatch_line",
           "check_env_name", "check_request_values"]
