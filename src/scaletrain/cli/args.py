"""Argument types for every verb: each value is checked, and bounded, when it is parsed.

A value that reaches a plan has been through one of these, so the planner never sees an empty
string that means "default", a 30-digit GPU count whose arithmetic grows with its size, a memory
size that rounds to ``--mem=0`` (Slurm: all of the node's memory), or a float that overflows.
Bounds are far above any real job and exist so that nothing grows with the size of a number.

argparse turns the ``ArgumentTypeError`` raised here into ``scaletrain: error: argument --flag:
<message>`` plus a hint (``scaletrain.cli.main``), exit code 2.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Callable

from scaletrain.plan.request import MAX_MEM_GB, MAX_PARAMS, MAX_TIME_S, MIN_MEM_GB
from scaletrain.plan.values import MAX_COUNT, has_control

MAX_TEXT = 4096            # a path or a name: PATH_MAX on Linux
MAX_NAME = 200             # a job name ends up in file names (255 bytes on most file systems)
# the request's own bounds (scaletrain.plan.request), applied to the text as it is parsed
MIN_MEM_MIB = MIN_MEM_GB * 1024   # below 1M Slurm's notation rounds to 0 = "all of the node's memory"
MAX_MEM_MIB = MAX_MEM_GB * 1024

_DIGITS = re.compile(r"[0-9]{1,12}")     # ASCII digits only: int() also reads '٣' and '1_0'

Type = Callable[[str], object]


def _fail(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


def count(*, low: int = 1, high: int = MAX_COUNT) -> Callable[[str], int]:
    """A whole number in ``low..high`` written with ASCII digits (``4``, not ``4.0``/``1e3``/``+4``)."""
    def parse(text: str) -> int:
        if not _DIGITS.fullmatch(text):
            raise _fail(f"expected a whole number from {low} to {high:,}, got {text!r:.40}")
        value = int(text)
        if not low <= value <= high:
            raise _fail(f"{value} is outside {low}..{high:,}")
        return value
    parse.__name__ = "number"    # argparse names the type in some messages
    return parse


def text(*, max_len: int = MAX_TEXT) -> Type:
    """A non-empty value without control characters (a path, an image, a profile file)."""
    def parse(value: str) -> str:
        if not value.strip():
            raise _fail("must not be empty (leave the flag out for the default)")
        if has_control(value):   # the renderer's own rule, so both refuse the same values
            raise _fail(f"contains a control character: {value!r:.60}")
        if len(value) > max_len:
            raise _fail(f"is {len(value)} characters long; at most {max_len} are accepted")
        return value
    parse.__name__ = "text"
    return parse


def data_path(value: str) -> str:
    """A dataset to stage: a file or folder, or a path that exists only on the cluster; never a
    device or pipe here (copying /dev/zero to the nodes never ends)."""
    import os
    import stat as _stat

    value = text()(value)    # type: ignore[assignment]
    try:
        mode = os.stat(os.path.expanduser(value)).st_mode
    except (OSError, ValueError):
        return value          # not here: it may exist on the cluster
    if not (_stat.S_ISREG(mode) or _stat.S_ISDIR(mode)):
        raise _fail(f"{value!r:.60} is not a file or folder (a device, pipe or socket)")
    return value


def name(value: str) -> str:
    """A Slurm name (cluster, partition, account): non-empty, no spaces or control characters."""
    value = text(max_len=MAX_NAME)(value)    # type: ignore[assignment]
    if re.search(r"\s", value):
        raise _fail(f"must not contain spaces: {value!r:.60}")
    return value


def job_name(value: str) -> str:
    """A job name; it becomes part of the Slurm output file name, so it cannot hold a path."""
    value = text(max_len=MAX_NAME)(value)    # type: ignore[assignment]
    if "/" in value or value.strip(".") == "":
        raise _fail(f"{value!r:.60} would put the job's output file outside its folder "
                    "(no '/', not '.' or '..')")
    return value


def time_limit(value: str) -> str:
    """A Slurm time limit (``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``...) above zero and at most a year."""
    from scaletrain.slurm.parse import parse_time_seconds

    value = text(max_len=40)(value)          # type: ignore[assignment]
    try:
        seconds = parse_time_seconds(value)
    except ValueError:
        seconds = None
    if seconds is None:
        raise _fail(f"{value!r} is not a time limit (write HH:MM:SS or D-HH:MM:SS)")
    if not 0 < seconds <= MAX_TIME_S:
        raise _fail(f"{value!r} must be above 0 and at most 365 days")
    return value.strip()


def mem_size(value: str) -> str:
    """A memory size (``64G``, ``32000M``; a bare number is GB) from 1M to 64T; kept as written."""
    from scaletrain.slurm.parse import parse_mem_mib

    value = text(max_len=40)(value)          # type: ignore[assignment]
    mib = parse_mem_mib(value, default_unit="G")
    if mib is None or not math.isfinite(mib):
        raise _fail(f"bad memory size {value!r} (write it like 32G or 32000M)")
    if not MIN_MEM_MIB <= mib <= MAX_MEM_MIB:
        raise _fail(f"{value!r} is outside 1M..64T (Slurm reads a size that rounds to 0 as "
                    "'all of the node's memory')")
    return value.strip()


def params(value: str) -> str:
    """A parameter count (``7e9``, ``7B``, ``350M``) from 1 to 1e15; kept as written."""
    from scaletrain.errors import UsageError
    from scaletrain.plan.request import parse_params

    value = text(max_len=40)(value)          # type: ignore[assignment]
    try:
        number = parse_params(value)
    except UsageError as exc:
        raise _fail(exc.message) from None
    if not (math.isfinite(number) and 1 <= number <= MAX_PARAMS):
        raise _fail(f"{value!r} is outside 1..1e15 parameters")
    return value


def refuse(message: str) -> type[argparse.Action]:
    """An action for a flag that exists only to say what to use instead (``--mem``)."""
    class Refuse(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                     values: object, option_string: str | None = None) -> None:
            parser.error(f"{option_string}: {message}")
    return Refuse


def check_utf8(argv: list[str]) -> None:
    """Refuse an argument holding bytes that are not UTF-8 (Python keeps them as surrogates in
    ``sys.argv``): such a value cannot be written into a script or a message, so the CLI stops
    before anything else happens. Raises UsageError naming the argument and its bytes."""
    from scaletrain.errors import UsageError

    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            try:
                shown = repr(arg.encode("utf-8", "surrogateescape"))   # the bytes as given
            except UnicodeEncodeError:
                shown = ascii(arg)
            raise UsageError(f"argument {i + 1} ({shown[:60]}) is not valid UTF-8",
                             "scaletrain writes arguments into UTF-8 scripts and messages: "
                             "pass the value (or rename the file) in UTF-8") from None
