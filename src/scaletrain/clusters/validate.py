"""The shapes a cluster profile's values may take: one check per kind, named in each field's
declaration (``clusters/model.py``), run by ``clusters/schema.py`` when a profile is loaded.

A profile is input like any other: users share the files and ``clusters probe`` writes them from
what ``sinfo`` says. Its values reach generated batch scripts, so each field has a shape, checked
before anything is rendered (issue 22). How each lands in the script:

- names and GRES types (``name``, partition names, ``gres_type``, ``scratch_gres``): one plain
  word, as Slurm spells them; they land on ``#SBATCH`` lines and in comments.
- ``master_addr_suffix``: host-name characters only; rendered in single quotes after the
  double-quoted ``$(scontrol ...)`` (never inside them, where ``$(...)`` would run).
- ``scratch_var``: a variable (``$LOCAL_SCRATCH``, ``${SLURM_TMPDIR}``) or an absolute path of
  plain characters; rendered inside double quotes so the variable expands on each node.
- ``python``: one command word (``python3``, ``/appl/bin/python``), written as the command.
- ``container`` and ``exec_wrapper``: a command with plain options (``apptainer exec --nv``),
  written as the start of the launch line.
- ``env``: variable names as bash exports them; values are single-quoted when rendered.
- ``setup_lines``, ``container_setup_lines``, ``python_env_lines``: shell code **by design**
  (``module load pytorch``, ``source $VENV/bin/activate``): written as they are, so a profile is
  trusted like a script you run. Each must be one line (no newline, NUL or other control
  character), so one entry cannot end a construct the next depends on.
- numbers: finite (``nan`` and ``inf`` are refused) and within what a node can have.
- free text (``description``, ``site``, ``gpu_model``, ``notes``, ``sources``): no control
  characters, so it cannot break a comment line or a terminal.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable

from scaletrain.errors import ProfileError
from scaletrain.slurm.parse import parse_time_seconds  # Slurm's time syntax, one parser

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
HOST_SUFFIX = re.compile(r"[A-Za-z0-9.-]*")
SCRATCH = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})|/[A-Za-z0-9_.+/-]*")
# a command or an image never starts with '-': a first word the shell would pass as an option
COMMAND_WORD = re.compile(r"[A-Za-z0-9_./+][A-Za-z0-9_./+-]*")
COMMAND = re.compile(r"[A-Za-z0-9_./+][A-Za-z0-9_./+-]*( +[A-Za-z0-9_./+=:,-]+)*")
IMAGE = re.compile(r"[A-Za-z0-9_./:@+][A-Za-z0-9_./:@+-]*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

# Upper bounds well above any machine (a 16-GPU node, 1,000 cores, 100 TB of memory) that still
# catch a slip of the keyboard before it becomes a plan with 10^20 GPUs.
MAX_GPUS_PER_NODE = 1024
MAX_CORES_PER_NODE = 1 << 20
MAX_GB = 1e8
MAX_COUNT = 10**7

# A check: (where, field, value) -> None, or ProfileError. ``where`` is (the file, the profile's name).
Where = tuple[str, str]
Check = Callable[[Where, str, Any], None]


def bad(path: str, what: str) -> ProfileError:
    """A mistake in the profile file at ``path``, said in ``what``."""
    return ProfileError(f"profile {path or '(inline)'}: {what}",
                        "fix the profile file (see the shipped ones in scaletrain/clusters/profiles)")


def _shape_error(where: Where, field: str, value: object, shape: str) -> ProfileError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ProfileError(f"profile {where[0] or where[1] or '(inline)'}: field {field!r} = {shown} "
                        f"is not {shape}",
                        f"write {field} as {shape} (see the shipped profiles in scaletrain/clusters/profiles)")


def pattern(regex: re.Pattern[str], shape: str, *, empty_ok: bool = True) -> Check:
    """Text that ``regex`` matches whole (None, and "" when ``empty_ok``, pass)."""
    def check(where: Where, field: str, value: Any) -> None:
        if value is None or (value == "" and empty_ok):
            return
        if not isinstance(value, str) or not regex.fullmatch(value):
            raise _shape_error(where, field, value, shape)
    return check


def line() -> Check:
    """One line of text: no newline, NUL or other control character."""
    def check(where: Where, field: str, value: Any) -> None:
        if not isinstance(value, str) or _CONTROL.search(value):
            raise _shape_error(where, field, value, "one line of text (no newline or other control character)")
    return check


def number(low: float, high: float, *, none_ok: bool = True) -> Check:
    """A finite number from ``low`` to ``high`` (None passes when ``none_ok``)."""
    def check(where: Where, field: str, value: Any) -> None:
        if value is None and none_ok:
            return
        if not isinstance(value, (int, float)) or isinstance(value, bool) \
                or not math.isfinite(value) or not low <= value <= high:
            raise _shape_error(where, field, value, f"a finite number from {low:g} to {high:g}")
    return check


def one_of(choices: Iterable[str]) -> Check:
    """One of ``choices``; for a list, each of its entries."""
    allowed = tuple(choices)

    def check(where: Where, field: str, value: Any) -> None:
        if isinstance(value, tuple):
            for item in value:
                if item not in allowed:
                    raise bad(where[0], f"{field} has {item!r}, not one of {', '.join(allowed)}")
        elif value not in allowed:
            raise bad(where[0], f"{field} {value!r} is not one of {', '.join(allowed)}")
    return check


def rule(test: Callable[[Any], bool], says: str) -> Check:
    """``test(value)`` holds, else the file's mistake: the field's name and ``says`` (which may
    show the value as ``{value!r}``)."""
    def check(where: Where, field: str, value: Any) -> None:
        if not test(value):
            raise bad(where[0], f"{field} {says.format(value=value)}")
    return check


def each(item: Check) -> Check:
    """Every entry of a list passes ``item``."""
    def check(where: Where, field: str, value: Any) -> None:
        for entry in value:
            item(where, field, entry)
    return check


def mapping(key: Check | None = None, value: Check | None = None, *, per_key: bool = False) -> Check:
    """Every key of a table passes ``key``, every value ``value`` (named FIELD.KEY when ``per_key``)."""
    def check(where: Where, field: str, table: Any) -> None:
        for k, v in (table or {}).items():
            if key is not None:
                key(where, field, k)
            if value is not None:
                value(where, f"{field}.{k}" if per_key else field, v)
    return check


def parse_time(text: str) -> int:
    """Slurm time ``[D-]HH:MM:SS`` (also ``MM``, ``MM:SS``, ``D-HH``, ``D-HH:MM``) to seconds."""
    try:
        seconds = parse_time_seconds(str(text))
    except ValueError:
        seconds = None
    if seconds is None:  # malformed, or a limit word such as UNLIMITED where a time is needed
        raise ProfileError(f"bad time {str(text).strip()!r}",
                           "write it as HH:MM:SS or D-HH:MM:SS, e.g. 01:30:00")
    return seconds


def slurm_time() -> Check:
    """A time in Slurm's syntax (None and "" pass: no limit)."""
    def check(where: Where, field: str, value: Any) -> None:
        if value:
            parse_time(value)
    return check


def date() -> Check:
    """A date YYYY-MM-DD (None and "" pass: not given)."""
    def check(where: Where, field: str, value: Any) -> None:
        if value and not _DATE.match(value):
            raise bad(where[0], f"field {field!r} must be a date YYYY-MM-DD, got {value!r}")
    return check


__all__ = ["Check", "bad", "date", "each", "line", "mapping", "number", "one_of", "parse_time",
           "pattern", "rule", "slurm_time"]
