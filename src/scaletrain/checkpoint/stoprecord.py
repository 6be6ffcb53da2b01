"""``stop.json``: why a job stopped on purpose and at which step, written and read here only.

On an agreed stop (a time limit, a preemption, ``scaletrain cancel --save``) the Checkpointer
saves the step, then rank 0 writes this record into its folder; a later run that goes on past
that step and ends without a stop marks the record superseded rather than deleting it (a report
still needs it). ``scaletrain status``, ``cancel`` and ``report`` read it back from the run
folder. One record, as JSON::

    {"reason": "time_limit", "step": 1200, "time": "2026-11-25T10:00:00+00:00",
     "signal": "SIGUSR1", "rank_count": 8, "restart_count": 0,
     "superseded": {"step": 2400, "time": "...", "by": "..."}}      # only once superseded

Writing imports the runtime (the stop's signal and the ranks that agreed) only when called;
reading imports nothing of it, so the after-submit verbs stay light.
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path
from typing import Any

from scaletrain.contract.files import STOP_RECORD
from scaletrain.fileio import atomic_write, json_text, read_json, read_json_object

def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_stop_record(directory: str | os.PathLike[str], *, reason: str, step: int,
                      log: bool = True) -> Path:
    """Write ``stop.json`` (why, step, time, signal, ranks, restarts) atomically; returns its path.

    Called on rank 0 by the Checkpointer once the stop's checkpoint is committed; also logs
    :func:`scaletrain.runtime.preempt.stop_message` on stderr unless ``log=False``.
    """
    from scaletrain.runtime import preempt
    from scaletrain.runtime.current import group_rank_world

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    ranks = group_rank_world()[1]   # the processes that agreed on this stop
    restart = os.environ.get("SLURM_RESTART_COUNT", "0").strip()
    record = {
        "reason": reason,
        "step": int(step),
        "time": _now(),
        "signal": preempt.signal_for(reason) or None,
        "rank_count": ranks,
        "restart_count": int(restart) if restart.isdigit() else 0,
    }
    path = atomic_write(folder / STOP_RECORD, json_text(record, indent=2) + "\n")
    if log:
        print(preempt.stop_message(reason, step, folder), file=sys.stderr, flush=True)
    return path


def mark_superseded(directory: str | os.PathLike[str], *, step: int) -> Path | None:
    """Say in ``stop.json`` that a later run went on past its stop and ended without one.

    The record of the last stop is kept (a report needs it), with ``superseded`` added, so that
    nobody reads an old stop as the state of a job that has since finished. Returns the path, or
    None when there is no record, it is already marked, or it is not older than ``step``.
    """
    path = Path(directory) / STOP_RECORD
    try:
        record = read_json(path)     # a pipe in its place is refused, not waited on; bounded in depth
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or "superseded" in record:
        return None
    old = record.get("step")
    if not isinstance(old, int) or isinstance(old, bool) or old >= step:
        return None
    record["superseded"] = {
        "step": int(step),
        "time": _now(),
        "by": "a later run went on past this stop and ended without stopping",
    }
    try:
        return atomic_write(path, json_text(record, indent=2) + "\n")
    except OSError:   # a read-only or full disk: the old record stays, nothing is lost
        return None


def has_stop_record(folder: Path) -> bool:
    """True when ``folder`` holds a ``stop.json`` (it is a Checkpointer's folder); False, not
    OSError, for a path the file system refuses."""
    try:
        return (folder / STOP_RECORD).is_file()
    except (OSError, ValueError):
        return False


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_stop_record(folder: Path | None) -> dict[str, Any] | None:
    """The record in ``folder``, or None when missing, unreadable or not a JSON object, its fields
    of the types the verbs show: a hand-edited value of another type is dropped or shown as text
    (stray bytes replaced: a hand-edited record is read, never an exception)."""
    record = read_json_object(folder / STOP_RECORD, errors="replace") if folder is not None else None
    if record is None:
        return None
    for key in ("reason", "signal"):
        if key in record and not isinstance(record[key], str):
            record[key] = json_text(record[key], default=str)[:200]
    for key in ("step", "restart_count"):
        if key in record and not _whole(record[key]):
            del record[key]
    later = record.get("superseded")
    if "superseded" in record and not (isinstance(later, dict) and _whole(later.get("step"))):
        del record["superseded"]
    return record
