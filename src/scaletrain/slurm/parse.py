"""Pure parsers for what Slurm's commands print: no subprocess here, text in, values out.

``scontrol show <entity> -o`` prints one record per line as ``Key=Value`` pairs separated by
spaces, but some values contain spaces themselves (``OS=Linux 6.1.0 #1 SMP ...``,
``Reason=Not responding [slurm@...]``), so a plain ``split()`` is wrong. Keys are recognised as
a space followed by ``Name=`` where the name looks like a Slurm field (letters, digits and the
``/ : _`` that appear in ``CPUs/Task`` or ``AllocNode:Sid``).

The unit tests feed these functions with output captured from real clusters
(tests/unit/test_slurm_parse.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A key starts a record or follows a space; values run until the next key.
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_]*(?:[/:][A-Za-z0-9_*]+)*)=")

# Job states after which nothing more will happen to the job (squeue(1) "JOB STATE CODES").
FINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED",
})


def parse_record(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` line as a dict ``{Key: Value}`` (values stripped)."""
    line = line.strip()
    matches = list(_KEY.finditer(line))
    record: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        record[match.group(1)] = line[match.end():end].strip()
    return record


def parse_records(text: str) -> list[dict[str, str]]:
    """Every non-empty line of ``scontrol show node|partition|job -o`` output as a record."""
    return [parse_record(line) for line in text.splitlines() if "=" in line]


@dataclass(frozen=True, kw_only=True)
class Gres:
    """One generic resource of a node: ``gpu:v100:4(S:0-1)`` -> name gpu, type v100, count 4."""

    name: str
    type: str | None
    count: int


def _split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses: ``gpu:a100:4(S:0,2),nvme:1`` has two items."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def parse_gres(text: str | None) -> list[Gres]:
    """A node's ``Gres=`` value as a list; ``(null)``/empty gives ``[]``.

    Accepts ``gpu:4``, ``gpu:v100:4(S:0-1)``, ``gpu:mi250:8,nvme:3600``, ``gpu:a100:4(IDX:0-3)``
    and a bare ``gpu`` (count 1). A count with a unit suffix (``nvme:3600G``) is read as its number.
    """
    if not text or text.strip() in {"(null)", "N/A", "none"}:
        return []
    result: list[Gres] = []
    for item in _split_top_level(text):
        item = item.split("(", 1)[0]  # drop the socket/index affinity: (S:0-1)
        parts = item.split(":")
        name = parts[0]
        gtype: str | None = None
        count = 1
        if len(parts) >= 2:
            last = parts[-1]
            digits = re.match(r"([0-9]+)([KMGTP]?)$", last)
            if digits:
                count = int(digits.group(1))
                if len(parts) >= 3:
                    gtype = ":".join(parts[1:-1])
            else:  # gpu:v100 with no count
                gtype = ":".join(parts[1:])
        result.append(Gres(name=name, type=gtype or None, count=count))
    return result


def gpu_gres(text: str | None) -> tuple[int, str | None]:
    """Total GPUs in a ``Gres=`` value and their type (``None`` when untyped or mixed)."""
    gpus = [g for g in parse_gres(text) if g.name == "gpu"]
    types = {g.type for g in gpus}
    return sum(g.count for g in gpus), (types.pop() if len(types) == 1 else None)


_TIME = re.compile(r"^(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?$")


def parse_time_seconds(text: str | None) -> int | None:
    """A Slurm time limit in seconds; ``INFINITE``/``UNLIMITED``/``NONE``/empty give ``None``.

    Slurm's formats: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``.
    Raises ValueError for anything else.
    """
    if text is None:
        return None
    text = text.strip()
    if text.upper() in {"", "INFINITE", "UNLIMITED", "NONE", "N/A"}:
        return None
    match = _TIME.match(text)
    if not match:
        raise ValueError(f"not a Slurm time: {text!r}")
    days, a, b, c = match.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (nums + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(nums) == 1:  # MM
        return nums[0] * 60
    if len(nums) == 2:  # MM:SS
        return nums[0] * 60 + nums[1]
    return (nums[0] * 60 + nums[1]) * 60 + nums[2]


_MEM = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_MEM_UNITS_MIB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024.0}


def parse_mem_mib(text: str | None, *, default_unit: str = "M") -> float | None:
    """A Slurm memory size (``64G``, ``32000M``, ``1T``, ``500``) in MiB; ``None`` if unreadable.

    Slurm's units are binary (M = MiB, G = GiB) and a bare number means ``default_unit``:
    MiB for ``--mem`` as sbatch reads it; callers with their own convention pass another.
    """
    if text is None:
        return None
    match = _MEM.match(str(text))
    if not match:
        return None
    return float(match.group(1)) * _MEM_UNITS_MIB[(match.group(2) or default_unit).upper()]


def format_time(seconds: int) -> str:
    """Seconds as ``HH:MM:SS``, or ``D-HH:MM:SS`` from one day up (what sbatch --time accepts)."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    hms = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{hms}" if days else hms


def parse_limit(text: str | None) -> int | None:
    """An integer limit such as ``MaxNodes``; ``UNLIMITED``/``N/A``/empty give ``None``."""
    if text is None:
        return None
    text = text.strip()
    if not is_count(text):
        return None
    return int(text)


def is_count(text: str) -> bool:
    """True for a plain decimal number in ASCII digits (``str.isdigit`` also takes ``²`` and ``٣``,
    which ``int`` then refuses or reads as another number)."""
    return text.isascii() and text.isdigit()


def parse_exit_code(text: str | None) -> tuple[int, int]:
    """``ExitCode=3:0`` -> ``(3, 0)``: the exit status and the signal that ended the job."""
    if not text:
        return 0, 0
    code, _, sig = text.partition(":")
    if not is_count(code) or not is_count(sig or "0"):
        return 0, 0
    return int(code), int(sig or 0)


def parse_job_id(text: str) -> str:
    """The job id from ``sbatch --parsable`` output (``123`` or ``123;cluster``)."""
    for line in text.splitlines():
        line = line.strip()
        head = line.split(";", 1)[0]
        if is_count(head):
            return head
    raise ValueError(f"no job id in sbatch output: {text.strip()!r}")


# ``squeue -O`` fields scaletrain asks for (one call for every run folder), each ended by "|".
SQUEUE_FIELDS = ("JobID", "State", "TimeUsed", "TimeLimit", "Reason", "NodeList", "RestartCnt",
                 "SubmitTime", "StartTime", "NumNodes")
# ``sacct -P`` fields: one line per allocation (-X), one per run of a requeued job (-D).
SACCT_FIELDS = ("JobID", "State", "Elapsed", "Timelimit", "ExitCode", "TotalCPU", "AllocCPUS",
                "NNodes", "AllocTRES", "NodeList", "Submit", "Start", "End")


def parse_delimited(text: str, fields: tuple[str, ...], sep: str = "|") -> list[dict[str, str]]:
    """Rows of ``squeue -O 'F:|,...'`` or ``sacct -P`` output as dicts keyed by ``fields``.

    Lines with fewer fields than asked for (a banner, a warning on stdout) are skipped;
    values are stripped (squeue pads them).
    """
    rows = []
    for line in text.splitlines():
        parts = line.split(sep)
        if len(parts) < len(fields):
            continue
        rows.append({name: parts[i].strip() for i, name in enumerate(fields)})
    return rows


def parse_duration_seconds(text: str | None) -> int | None:
    """An elapsed time as squeue/sacct print it (``1-02:03:04``, ``02:03:04``, ``03:04``,
    ``00:01.234`` for TotalCPU) in whole seconds; None when unreadable."""
    if not text:
        return None
    text = text.strip().split(".", 1)[0]
    match = re.match(r"^(?:([0-9]+)-)?(?:([0-9]+):)?([0-9]+):([0-9]+)$", text)
    if not match:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def base_state(text: str) -> str:
    """``CANCELLED by 1000`` -> ``CANCELLED``; empty -> ``UNKNOWN``."""
    return (text.split() or ["UNKNOWN"])[0]


# A Slurm release as `sinfo --version` prints it ("slurm 23.11.4") or as a profile writes it
# ("23.11", "22.05.9"): year.month of the major release, then the maintenance release.
_VERSION = re.compile(r"^(?:slurm(?:-wlm)?\s+)?(\d{2})\.(\d{2})(?:\.(\d+))?(?:[-.+\w]*)$", re.IGNORECASE)


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``(major year, month, maintenance)`` of a Slurm version text, or None when it is not one.

    ``"slurm 23.11.4"`` -> (23, 11, 4); ``"22.05"`` -> (22, 5, 0); ``"unknown"`` -> None.
    """
    m = _VERSION.match((text or "").strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def slurm_release(version_text: str) -> str | None:
    """``"23.11.4"`` from ``sinfo --version``'s ``"slurm 23.11.4"``; None when it names no release."""
    release = parse_version(version_text)
    return f"{release[0]}.{release[1]:02d}.{release[2]}" if release else None


# What srun inherits changed twice; SchedMD's changelog (github.com/SchedMD/slurm, CHANGELOG/):
# slurm-22.05.md, 22.05.0rc1: "Make it so srun no longer inherits SLURM_CPUS_PER_TASK. It now will
# only inherit SRUN_CPUS_PER_TASK."; slurm-23.11.md, 23.11.0rc1: "Replace SRUN_CPUS_PER_TASK with
# SLURM_CPUS_PER_TASK and get back the previous behavior before Slurm 22.05 since now we have the new
# external launcher step." So srun drops sbatch's --cpus-per-task only from 22.05 to 23.02, and
# there only: lint's rule and plan's script need the cluster's Slurm version (the profile's slurm_version).
SRUN_DROPS_CPUS_PER_TASK = ((22, 5), (23, 11))   # [first release, first release that restored it)


def srun_drops_cpus_per_task(slurm_version: str | None) -> bool:
    """Whether srun of Slurm ``slurm_version`` leaves out sbatch's --cpus-per-task (False: unknown)."""
    release = parse_version(slurm_version)
    first, restored = SRUN_DROPS_CPUS_PER_TASK
    return release is not None and first <= release[:2] < restored


def srun_cpus_export(slurm_version: str | None) -> bool:
    """Whether a batch script should export SRUN_CPUS_PER_TASK: unless the release is known and its
    srun passes sbatch's --cpus-per-task on (before 22.05, and 23.11 on)."""
    return parse_version(slurm_version) is None or srun_drops_cpus_per_task(slurm_version)
