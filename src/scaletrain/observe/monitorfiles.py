"""Reading back the Monitor's files: the one reader of ``metrics.jsonl`` and ``summary.json``.

The Monitor appends a line per record (:func:`scaletrain.observe.records.encode` and the step
lines of :class:`~scaletrain.observe.records.StepBatch`, through
:class:`~scaletrain.observe.sinks.JsonlSink`): a ``start`` line per run, ``step`` lines, events
and a ``summary`` line when a run closes. ``scaletrain status`` wants the last run's start and
last step of a file that may hold millions of lines; ``scaletrain report`` wants every record.
Both read it here, so the writer's format and the reader's rules change together. At close the
Monitor also writes ``summary.json`` (:meth:`~scaletrain.observe.monitor.Monitor.close`), whose
measured step ``plan --explain`` models from: :func:`summary_step` says what its fields mean.

Reading is tolerant and bounded: a truncated last line (a job killed mid-write), a hand-edited
value of the wrong type or a line that is not JSON is skipped, never an exception; a line over
:data:`~scaletrain.fileio.LINE_BYTES` is not the Monitor's and is skipped whole; the tail is
searched backwards a MiB at a time, at most :data:`SCAN_BYTES`; a pipe or device in the file's
place is refused, not waited on. NaN, which the writer writes as null, reads back as None.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

from scaletrain.fileio import LINE_BYTES, json_lines, json_text, open_regular
from scaletrain.jsonfile import loads as json_loads
from scaletrain.observe.records import encode
from scaletrain.settings import Bad, Check, count, number

SCAN_BYTES = 1024 * 1024 * 1024  # how far back status looks for the run's start line, 1 MiB at a time
DAMAGED_TRIES = 8                # step lines tried back from the end when the last ones do not parse
# How the writer starts a step and a start line: found by their first bytes, not by parsing every line.
STEP_HEAD = encode({"type": "step"})[:-1].encode()
START_HEAD = encode({"type": "start"})[:-1].encode()

# The fields that the after-submit verbs compute with, and what each must be. A hand-edited value
# of another type is dropped (the figure is then unknown), never computed with.
_COUNTS = ("step", "start_step", "total_steps", "samples")
_NUMBERS = ("t", "step_s", "samples_per_s", "loss", "time")
_POSITIVE = ("step_s", "samples_per_s", "total_steps")


def clean_record(value: Any) -> dict[str, Any] | None:
    """One metrics.jsonl record with every field we compute with of the right type, or None.

    A ``step`` record without a whole step number and a time is not the Monitor's: skipped.
    """
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        return None
    rec = dict(value)
    for key in _COUNTS:
        v = rec.get(key)
        if key in rec and (isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 10**15):
            del rec[key]
    for key in _NUMBERS:
        v = rec.get(key)
        if key in rec and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                           or abs(v) > 1e15):
            del rec[key]
    for key in _POSITIVE:
        if key in rec and rec[key] <= 0:
            del rec[key]
    for key in ("message", "hint", "reason"):
        if key in rec and not isinstance(rec[key], str):
            rec[key] = json_text(rec[key], default=str)[:500]
    if "device_util" in rec and not isinstance(rec["device_util"], dict):
        del rec["device_util"]
    if rec["type"] == "step" and ("step" not in rec or "t" not in rec):
        return None
    return rec


def read_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every usable record of a metrics.jsonl, oldest first, streamed (:func:`clean_record`'s
    rules). ``OSError`` when it cannot be opened or is not a regular file, or the disk fails
    part-way (the records before it have been given)."""
    for value in json_lines(path):
        rec = clean_record(value)
        if rec is not None:
            yield rec


def _last(fh: IO[bytes], needle: bytes, end: int, *, floor: int = 0) -> int:
    """Offset of the last ``needle`` that starts before ``end`` (not below ``floor``), or -1:
    read backwards a MiB at a time, so memory stays bounded however long the file."""
    chunk, pos = 1 << 20, end
    while pos > floor:
        lo = max(floor, pos - chunk)
        fh.seek(lo)
        found = fh.read(pos - lo + len(needle) - 1).rfind(needle)
        if found >= 0 and lo + found < end:
            return lo + found
        pos = lo
    return -1


def _record_at(fh: IO[bytes], offset: int) -> dict[str, Any] | None:
    if offset < 0:
        return None
    fh.seek(offset)
    try:
        return clean_record(json_loads(fh.readline(LINE_BYTES)))
    except ValueError:
        return None           # a half-written, hand-edited or too deep line: skipped


def metrics_tail(path: Path | None, limit: int = SCAN_BYTES) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the last run's ``start`` line, its last ``step`` line) from the end of metrics.jsonl.

    Both are found reading backwards from the end (at most ``limit`` bytes, a MiB at a time); only
    those two lines are parsed, so 200 folders cost milliseconds each. A step line cut short (a job
    killed mid-write) gives way to the whole one before it. ``OSError`` when the file cannot be
    read (a pipe or device in its place is refused, not waited on): the caller says so.
    """
    if path is None:
        return None, None
    with open_regular(path) as fh:
        size = fh.seek(0, os.SEEK_END)
        floor = max(0, size - limit)
        at_step = _last(fh, STEP_HEAD, size, floor=floor)
        at_start = _last(fh, START_HEAD, size, floor=floor)
        start = _record_at(fh, at_start)
        last = None
        for _ in range(DAMAGED_TRIES):
            if at_step <= at_start:         # no (whole) step yet in this run
                break
            last = _record_at(fh, at_step)
            if last is not None and last["type"] == "step":
                break
            last, at_step = None, _last(fh, STEP_HEAD, at_step, floor=max(floor, at_start))
    return start, last


@dataclass(frozen=True, kw_only=True)
class SummaryStep:
    """What a Monitor summary says of the run's step, for ``plan --explain``."""

    step_s: float                 # the median step time after warm-up, seconds
    samples_per_step: float       # per process
    data_wait_frac: float         # share of the step spent waiting for data
    grad_bytes: int | None        # the gradients all-reduced per step (``monitor.watch(model)``), or None
    samples: float                # the run's work: every process's samples together
    steps: object                 # steps measured, as the summary gives it ("?" when it does not)
    world_size: int
    device: str | None = None     # where it ran ("cpu", "cuda:0", ...), None in an older summary


def summary_step(summary: Mapping[str, Any]) -> SummaryStep | None:
    """The measured step of a ``summary.json`` (a JSON object, as read), or None when it has none
    (fewer steps than the Monitor's warm-up, or the figures edited out or of the wrong type)."""
    step_s = _figure(summary, "step_s_median", number(above=0, high=1e9))
    per_step = _figure(summary, "samples_per_step", number(above=0, high=1e15))
    if step_s is None or per_step is None:
        return None
    world = _figure(summary, "world_size", count()) or 1
    device = summary.get("device")
    return SummaryStep(step_s=step_s, samples_per_step=per_step,
                       data_wait_frac=_figure(summary, "data_wait_frac", number(low=0, high=1)) or 0.0,
                       grad_bytes=_figure(summary, "grad_bytes", count(low=0, high=2**62)) or None,
                       samples=(_figure(summary, "total_samples", number(low=0, high=1e18)) or 0.0) * world,
                       steps=summary.get("steps", "?"), world_size=world,
                       device=device if isinstance(device, str) else None)


def _figure(summary: Mapping[str, Any], key: str, shape: Check) -> Any:
    """``summary[key]`` when it has ``shape`` (a settings check), else None: a value edited by
    hand, of another type or out of range (10**400, NaN) is a figure not known, never one computed with."""
    try:
        return shape(summary.get(key))
    except Bad:
        return None
