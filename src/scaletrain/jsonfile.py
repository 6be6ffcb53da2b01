"""The one JSON parser for everything scaletrain reads: bounded in size, in depth and in its numbers.

Every JSON we read comes from a file a run left behind (a checkpoint's commit marker, a run
folder's records, ``metrics.jsonl``, ``scaling.json``, a Monitor's ``summary.json``), a tool's
output or a variable: any of it may be damaged or forged. Python's parser recurses once per
level of nesting, so 100,000 nested brackets end in ``RecursionError`` wherever it is called,
which no reader expects. Here a text deeper than :data:`MAX_DEPTH` levels or longer than its
bound is refused *before* it is parsed, with :class:`JSONLimit`: a ``ValueError``, which every
reader already treats as "not valid JSON" (and falls back or says so in one line).

Every number is checked for range as it is parsed: an integer past 64 bits, a float past a
float (``1e400`` reads as inf) or ``NaN``/``Infinity`` is a ``ValueError`` too, so no reader ever
computes with one (``10**400`` gave OverflowError in ``report`` and ``status``); our writers write
null for a number they do not have (``fileio.json_text``).

What we write nests at most 6 levels (a commit marker: marker, checksums, file), so the bound
is far from anything real; a text is scanned for its depth only when it has more brackets than
the bound (a ``metrics.jsonl`` line has a handful), so the common case costs two ``count``s.
This module imports nothing of scaletrain: the worker shim and every verb may use it.
"""

from __future__ import annotations

import json
import math
import operator
import re
from itertools import accumulate, count
from typing import Any

MAX_DEPTH = 64                   # levels of [ and { a text we read may nest
MAX_BYTES = 16 * 1024 * 1024     # characters of one text (fileio.READ_LIMIT: the same bound)

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)   # a string literal: its brackets do not nest
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# an opening bracket as 2, a closing one as 0 (see depth_over)
_WEIGHTS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")


# The widest whole number a file of ours holds (a size, a step, a time in ns): a signed 64-bit
# integer, 19 digits. Past it (10**400) a number is not one we wrote, and no float can hold it.
MAX_JSON_INT = 2**63 - 1


def _json_int(text: str) -> int:
    if len(text) > 20 or not -MAX_JSON_INT <= (value := int(text)) <= MAX_JSON_INT:
        raise ValueError(f"integer out of range: {text[:24]}")
    return value


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):    # 1e400 reads as inf
        raise ValueError(f"number out of range: {text[:24]}")
    return value


def _json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")     # NaN, Infinity


class JSONLimit(ValueError):
    """A JSON text beyond our bounds (too deep, too long, a repeated key): refused unparsed."""


def depth_over(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether ``text`` nests more than ``limit`` levels of arrays and objects (strings skipped)."""
    if text.count("[") + text.count("{") <= limit:
        return False                 # cannot nest deeper than it has openings
    # The brackets alone, as bytes: an opening one weighs 2, a closing one 0, so after k brackets
    # the running sum is twice the openings and the depth there is that sum less k. accumulate,
    # map and max all loop in C: a Python loop over a large text took as long as parsing it.
    skeleton = _NOT_BRACKET.sub("", _STRING.sub("", text)).encode("ascii").translate(_WEIGHTS)
    return max(map(operator.sub, accumulate(skeleton), count(1)), default=0) > limit


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JSONLimit(f"the key {key[:80]!r} appears twice in one object")
        out[key] = value
    return out


def loads(data: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES,
          unique_keys: bool = False, errors: str = "strict") -> Any:
    """``json.loads`` within bounds: :class:`JSONLimit` for a text longer than ``max_bytes`` or
    nested deeper than ``max_depth``; ``ValueError`` for one that is not JSON (bytes that are not
    UTF-8 included, unless ``errors="replace"``). ``unique_keys``: an object that names a key twice
    is refused (a record we write never does; a forged one could hide a second value)."""
    if len(data) > max_bytes:
        raise JSONLimit(f"{len(data)} bytes of JSON, more than the {max_bytes} read")
    text = data if isinstance(data, str) else bytes(data).decode("utf-8", errors=errors)
    if depth_over(text, max_depth):
        raise JSONLimit(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text, object_pairs_hook=_unique if unique_keys else None, parse_int=_json_int,
                          parse_float=_json_float, parse_constant=_json_constant)
    except RecursionError:           # a stack smaller than the bound assumes: still one answer
        raise JSONLimit(f"JSON nested too deep for this Python's stack") from None
