"""Slurm's compact host and task lists, expanded in pure Python (no ``scontrol``, no torch).

Slurm hands every task its job's nodes as one hostlist expression (``SLURM_JOB_NODELIST``)
and its task layout as a run-length list (``SLURM_TASKS_PER_NODE``). Rank 0 runs on the first
node, so the first host is the rendezvous address every task can compute on its own, without
a subprocess per task. The grammar follows Slurm's ``hostlist.c`` (checked against
``scontrol show hostnames`` by a differential test):

* hosts are separated by commas or whitespace (commas inside brackets separate ranges);
* ``[lo-hi]`` ranges keep the zero padding of ``lo`` (``n[008-11]`` -> ``n008``..``n011``,
  ``n[9-010]`` -> ``n9``, ``n10``); ``[a,b-c]`` lists several ranges;
* several bracket groups in one host are a cartesian product (``a[01-02]b[1-2]``), in Slurm's
  order: the last group varies fastest, then the first, second, ... (which is plain
  lexicographic order for two groups);
* text after the last bracket (``n[1-2]-ib``) is accepted as a suffix (newer Slurm releases
  accept it; 22.05 rejects it);
* duplicates are kept, as Slurm keeps them.
"""

from __future__ import annotations

import re
from typing import NoReturn
from itertools import product

from scaletrain.errors import DistEnvError, ScaletrainError

# Slurm refuses a single range of more than 64Ki hosts; a total cap keeps a typo such as
# ``n[1-99999999]`` from eating memory.
MAX_RANGE = 65536
MAX_HOSTS = 1 << 20

_RANGE_RE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", re.ASCII)  # Slurm reads ASCII digits only
_TASKS_RE = re.compile(r"\s*(\d+)\s*(?:\(\s*x\s*(\d+)\s*\)\s*)?", re.ASCII)

_HOSTLIST_HINT = ("use Slurm's hostlist form, e.g. 'nid[001-004,007]', 'gpu-[1,3-5],cpu7' "
                  "or 'a[01-02]b[1-2]' (check SLURM_JOB_NODELIST)")


def _fail(error: type[ScaletrainError], text: str, why: str, hint: str = _HOSTLIST_HINT) -> NoReturn:
    raise error(f"bad host list {text!r}: {why}", hint)


def _split_hosts(text: str, error: type[ScaletrainError]) -> list[str]:
    """Split at commas and whitespace that are outside brackets; check bracket balance."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "[":
            if depth:
                _fail(error, text, "nested '['")
            depth = 1
        elif ch == "]":
            if not depth:
                _fail(error, text, "']' without '['")
            depth = 0
        elif depth == 0 and (ch == "," or ch.isspace()):
            if current:
                items.append("".join(current))
            current = []
            continue
        current.append(ch)
    if depth:
        _fail(error, text, "'[' is never closed")
    if current:
        items.append("".join(current))
    return items


def _expand_ranges(body: str, text: str, error: type[ScaletrainError]) -> list[str]:
    """``'001-004,007'`` -> ``['001', '002', '003', '004', '007']`` (Slurm's padding rule)."""
    values: list[str] = []
    for part in body.split(","):
        match = _RANGE_RE.fullmatch(part)
        if match is None:
            _fail(error, text, f"range '{part.strip()}' is not N or N-M with digits")
        lo_text, hi_text = match.group(1), match.group(2)
        lo = int(lo_text)
        hi = lo if hi_text is None else int(hi_text)
        if hi < lo:
            _fail(error, text, f"range '{part.strip()}' goes backwards")
        if hi - lo + 1 > MAX_RANGE:
            _fail(error, text, f"range '{part.strip()}' has more than {MAX_RANGE} hosts")
        width = len(lo_text)  # Slurm pads to the width of the low bound as written
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values


def _expand_host(item: str, text: str, error: type[ScaletrainError]) -> list[str]:
    """One host expression, possibly with several bracket groups, in Slurm's order."""
    pieces = re.split(r"\[([^\]]*)\]", item)
    # pieces = [literal, group, literal, group, ..., literal]
    literals = pieces[0::2]
    groups = [_expand_ranges(body, text, error) for body in pieces[1::2]]
    if not groups:
        return [item]
    count = 1
    for g in groups:
        count *= len(g)
    if count > MAX_HOSTS:
        _fail(error, text, f"'{item}' names more than {MAX_HOSTS} hosts")
    # Slurm expands the last group innermost and the others from the right-most outward
    # (hostlist.c recurses on strrchr('[') of the prefix): loop order g[k-2], ..., g[0], g[k-1].
    k = len(groups)
    order = [*range(k - 2, -1, -1), k - 1]
    hosts: list[str] = []
    for combo in product(*(groups[i] for i in order)):
        chosen = dict(zip(order, combo))
        parts = [literals[0]]
        for i in range(k):
            parts.append(chosen[i])
            parts.append(literals[i + 1])
        hosts.append("".join(parts))
    return hosts


def expand_hostlist(text: str, *, error: type[ScaletrainError] = DistEnvError) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in Slurm's order.

    >>> expand_hostlist("nid[001-003,007]")
    ['nid001', 'nid002', 'nid003', 'nid007']
    >>> expand_hostlist("gpu-[1,3-4],cpu7")
    ['gpu-1', 'gpu-3', 'gpu-4', 'cpu7']

    Raises ``error`` (default :class:`DistEnvError`, since the list usually comes from the
    environment; pass :class:`UsageError` for user input) on an empty or malformed list.
    """
    if not isinstance(text, str):
        raise error(f"bad host list {text!r}: not a string", _HOSTLIST_HINT)
    hosts: list[str] = []
    for item in _split_hosts(text, error):
        hosts.extend(_expand_host(item, text, error))
        if len(hosts) > MAX_HOSTS:
            _fail(error, text, f"more than {MAX_HOSTS} hosts")
    if not hosts:
        _fail(error, text, "no host in it")
    return hosts


def first_host(text: str, *, error: type[ScaletrainError] = DistEnvError) -> str:
    """The first host of a hostlist expression: where Slurm places rank 0."""
    return expand_hostlist(text, error=error)[0]


def parse_tasks_per_node(text: str, *, name: str = "SLURM_TASKS_PER_NODE",
                         error: type[ScaletrainError] = DistEnvError) -> list[int]:
    """Expand Slurm's run-length task counts: ``'2(x3),1'`` -> ``[2, 2, 2, 1]``.

    ``name`` is the variable the text came from, for the error message.
    """
    counts: list[int] = []
    for part in text.split(","):
        match = _TASKS_RE.fullmatch(part)
        if match is None:
            raise error(f"{name}={text!r} is not Slurm's task list form",
                        "expected counts like '4', '2(x3),1' or '2,1'")
        repeat = int(match.group(2) or 1)
        if repeat < 1 or repeat > MAX_HOSTS:
            raise error(f"{name}={text!r} repeats a count {repeat} times",
                        "expected counts like '2(x3),1'")
        counts.extend([int(match.group(1))] * repeat)
    return counts
