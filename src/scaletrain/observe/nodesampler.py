"""``python -m scaletrain.observe.nodesampler DIR``: one light GPU sampler per node, for any program.

A program that does not use the Monitor still deserves a report of what its GPUs did. With
``plan/submit --sample-gpus S`` the generated job starts this module once per node in the
background (``srun --overlap``, one task per node), before the program. Every ``S`` seconds it
reads every GPU of the node through NVML or AMD SMI (the Monitor's backends,
:mod:`scaletrain.observe.devices`; no torch) and appends one JSON line to
``DIR/gpus-<host>.jsonl``::

    {"type": "sampler", "host": "g1101", "interval_s": 10, "backend": "nvidia"}   (or "reason")
    {"t": 1764031200.1, "devices": {"0": {"util_pct": 97.0, "mem_gb": 61.2, "power_w": 402.0}, ...},
     "totals": {"0": [readings, sum of util_pct, busy seconds], ...}}

Each reading carries its devices' totals since the file began (a requeued job's sampler appends
to the same file and carries the totals on), so a reader of a 6,000-node job needs each file's
last line, not every line: :func:`summarize` and :func:`sample_readings` (docs/scale.md).

It stops on SIGTERM (the end of the job) or when the node has no GPU it can read (one line that
says why, then exit 0: a sampler never fails a job). ``scaletrain report`` reads these files back
through :func:`read_samples`, :func:`summarize` and :func:`sample_readings`, the readers of what
:func:`sample_loop` writes.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from scaletrain import settings
from scaletrain.contract.files import GPU_SAMPLES_PREFIX
from scaletrain.errors import UsageError
from scaletrain.fileio import LINE_BYTES, json_lines, json_text, open_regular
from scaletrain.observe.devices import Backend, open_backend

VENDORS = ("nvidia", "amd")
DEFAULT_INTERVAL_S = 10.0   # seconds between readings unless --interval says otherwise


def first_backend() -> tuple[Backend | None, str, str]:
    """(backend, vendor, reason): the first vendor whose library reads this node's GPUs."""
    reasons = []
    for vendor in VENDORS:
        backend, reason = open_backend(vendor)
        if backend is not None:
            return backend, vendor, ""
        reasons.append(f"{vendor}: {reason}")
    return None, "", "; ".join(reasons)


def samples_path(out_dir: Path, host: str) -> Path:
    """The file the sampler of ``host`` appends to in ``out_dir``."""
    return out_dir / f"{GPU_SAMPLES_PREFIX}{host}.jsonl"


def sample_files(folder: Path) -> list[Path]:
    """Every sampler's file in ``folder``, by name; an unreadable folder has none."""
    try:
        return sorted(folder.glob(f"{GPU_SAMPLES_PREFIX}*.jsonl"))
    except OSError:
        return []


@dataclass(frozen=True, kw_only=True)
class SamplerLine:
    """A sampler's header (or its last word): which host, and why it reads no GPU if it does not."""

    host: str
    reason: str | None


@dataclass(frozen=True, kw_only=True)
class Reading:
    """One reading of a node's GPUs, every ``interval_s`` seconds on ``host``: ``devices`` maps a
    GPU's index to (utilisation %, memory GB), either None where the line held no finite number."""

    host: str
    interval_s: float
    t: float
    devices: dict[str, tuple[float | None, float | None]]


def _number(value: Any, *, low: float = 0.0) -> float | None:
    """A finite reading from ``low`` up, else None (a hand-edited or garbled value is no reading)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if low <= value <= 1e15 else None


def read_samples(path: str | os.PathLike[str]) -> Iterator[SamplerLine | Reading]:
    """The lines of one sampler's file, oldest first, streamed with bounded memory
    (:func:`scaletrain.fileio.json_lines`): a line the sampler did not write (not JSON, cut short,
    edited by hand) is skipped, a figure that is not a finite number reads as None. A reading
    belongs to the host and interval of the header before it (the file name's host and the
    default interval before any). ``OSError`` when the file cannot be read."""
    host, interval = Path(path).stem[len(GPU_SAMPLES_PREFIX):], DEFAULT_INTERVAL_S
    for rec in json_lines(path):
        if not isinstance(rec, dict):
            continue
        if rec.get("type") == "sampler":
            host = str(rec.get("host", host))[:200]
            interval = _number(rec.get("interval_s"), low=1e-3) or interval
            yield SamplerLine(host=host, reason=str(rec["reason"]) if rec.get("reason") else None)
            continue
        devices, when = rec.get("devices"), _number(rec.get("t"))
        if not isinstance(devices, dict) or when is None:
            continue                          # not a reading the sampler wrote
        yield Reading(host=host, interval_s=interval, t=when,
                      devices={str(dev): (_number(fig.get("util_pct")), _number(fig.get("mem_gb")))
                               for dev, fig in devices.items() if isinstance(fig, dict)})


TOTALS = "totals"        # a reading's per-device totals since the file began
_HEAD_BYTES = 8 * 1024   # what is read of a file's start for its header and first reading
_TAIL_BYTES = 256 * 1024  # ... and of its end for the last reading


@dataclass(frozen=True, kw_only=True)
class Summary:
    """A sampler file's figures from its first and last lines: per device (readings, sum of the
    utilisation readings, busy seconds), the interval and the first and last reading's times."""

    host: str
    interval_s: float
    first_t: float | None
    last_t: float | None
    totals: dict[str, tuple[int, float, float]]
    reason: str | None


def _parsed(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The lines that parse as JSON objects, in the order given (a cut line is none)."""
    from scaletrain.jsonfile import loads

    for raw in lines:
        try:
            rec = loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict):
            yield rec


def _totals(rec: dict[str, Any]) -> dict[str, tuple[int, float, float]] | None:
    """A reading line's totals, or None where it has none or they are not numbers."""
    raw = rec.get(TOTALS)
    if not isinstance(raw, dict):
        return None
    out = {}
    for dev, vals in raw.items():
        if not (isinstance(vals, list) and len(vals) == 3 and all(_number(v) is not None for v in vals)):
            return None
        out[str(dev)] = (int(vals[0]), float(vals[1]), float(vals[2]))
    return out


def summarize(path: str | os.PathLike[str]) -> Summary | None:
    """The file's figures without reading its readings: its first line (header), first reading and
    last reading (whose totals cover the whole file). None when its last reading carries no totals
    (a sampler older than them, or none at all): read it with :func:`read_samples` then.
    ``OSError`` when the file cannot be read."""
    from scaletrain.fileio import read_tail

    with open_regular(path) as fh:
        head = list(itertools.islice(_parsed(fh.read(_HEAD_BYTES).split(b"\n")), 4))
    last = None
    for limit in (_TAIL_BYTES // 16, _TAIL_BYTES):   # a few lines, then more where they are long
        last = next((rec for rec in _parsed(reversed(read_tail(path, limit).split(b"\n")))
                     if _totals(rec) is not None), None)
        if last is not None:
            break
    if last is None:
        return None
    first = next((rec for rec in head if "devices" in rec), last)
    header = next((rec for rec in head if rec.get("type") == "sampler"), {})
    host = str(header.get("host", Path(path).stem[len(GPU_SAMPLES_PREFIX):]))[:200]
    return Summary(host=host, interval_s=_number(header.get("interval_s"), low=1e-3) or DEFAULT_INTERVAL_S,
                   first_t=_number(first.get("t")), last_t=_number(last.get("t")), totals=_totals(last) or {},
                   reason=str(header["reason"]) if header.get("reason") else None)


def sample_readings(path: str | os.PathLike[str], count: int) -> list[Reading]:
    """About ``count`` readings spread evenly over the file (for a chart), each found by seeking
    to a point of the file and reading the next whole line: ``count`` lines read, not the file."""
    out: list[Reading] = []
    host = Path(path).stem[len(GPU_SAMPLES_PREFIX):]
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        for i in range(max(1, count)):
            fh.seek(size * i // max(1, count))
            if i:
                fh.readline(LINE_BYTES)          # the rest of the line the seek fell into
            for rec in _parsed([fh.readline(LINE_BYTES)]):
                devices, when = rec.get("devices"), _number(rec.get("t"))
                if isinstance(devices, dict) and when is not None:
                    out.append(Reading(host=host, interval_s=0.0, t=when,
                                       devices={str(d): (_number(f.get("util_pct")), _number(f.get("mem_gb")))
                                                for d, f in devices.items() if isinstance(f, dict)}))
    return out


def _carried(path: Path) -> dict[str, list[float]]:
    """The totals of the file's last reading, to carry on from (a requeued run appends)."""
    try:
        found = summarize(path)
    except OSError:
        return {}
    return {dev: [float(n), s, b] for dev, (n, s, b) in found.totals.items()} if found else {}


def sample_loop(out_dir: Path, interval_s: float, backend: Backend | None, *, vendor: str = "",
                reason: str = "", host: str | None = None, stop: threading.Event | None = None,
                max_samples: int | None = None) -> Path:
    """Append the header line, then a line per reading until ``stop`` is set; returns the file."""
    host = host or socket.gethostname()
    stop = stop or threading.Event()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = samples_path(out_dir, host)
    head: dict[str, Any] = {"type": "sampler", "host": host, "interval_s": interval_s}
    head.update({"backend": vendor} if backend is not None else {"reason": reason or "no GPU backend"})
    totals = _carried(path) if path.exists() else {}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json_text(head) + "\n")
        fh.flush()
        taken = 0
        while backend is not None and not stop.is_set():
            try:
                readings = backend.read()
            except Exception as exc:  # noqa: BLE001 - a driver hiccup ends sampling, never the job
                fh.write(json_text({"type": "sampler", "host": host, "reason": f"read failed: {exc}"}) + "\n")
                break
            line = {"t": round(time.time(), 3), "devices": {str(k): asdict(v) for k, v in readings.items()},
                    TOTALS: _add(totals, readings, interval_s)}
            fh.write(json_text(line) + "\n")
            fh.flush()             # whole lines only: a reader never sees half of one
            taken += 1
            if max_samples is not None and taken >= max_samples:
                break
            stop.wait(interval_s)
    if backend is not None:
        backend.close()
    return path


def _add(totals: dict[str, list[float]], readings: dict[Any, Any], interval_s: float) -> dict[str, list[float]]:
    """Count one reading of each device into ``totals`` (those with a utilisation); the totals."""
    for dev, sample in readings.items():
        t = totals.setdefault(str(dev), [0, 0.0, 0.0])   # a device without readings is listed too
        util = _number(getattr(sample, "util_pct", None))
        if util is None:
            continue
        t[0] += 1
        t[1] = round(t[1] + util, 3)
        t[2] = round(t[2] + util / 100 * interval_s, 3)
    return {dev: list(t) for dev, t in totals.items()}


# --interval, in the settings vocabulary and the bounds of the request's --sample-gpus S (NaN was
# taken as 1 s, -5 as 1 s, 1e400 ended the loop in an OverflowError)
INTERVAL = settings.Spec(doc="seconds between readings, e.g. --interval 10", unit="seconds",
                         check=settings.number(low=1, high=3600))


def _float_or_text(text: str) -> object:
    try:
        return float(text)
    except ValueError:
        return text


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: ``DIR [--interval S]``; SIGTERM ends the loop."""
    parser = argparse.ArgumentParser(prog="python -m scaletrain.observe.nodesampler",
                                     description="Sample this node's GPUs into DIR/gpus-<host>.jsonl")
    parser.add_argument("dir")
    parser.add_argument("--interval", default=str(DEFAULT_INTERVAL_S), metavar="S")
    args = parser.parse_args(argv)
    out = Path(args.dir)
    try:
        interval = settings.check_value(INTERVAL, _float_or_text(args.interval), "--interval")
        if out.exists() and not out.is_dir():
            raise UsageError(f"{args.dir} is not a folder: the sampler writes gpus-<host>.jsonl into a folder",
                             "give the run folder (it is created if missing)")
    except UsageError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    backend, vendor, reason = first_backend()
    try:
        sample_loop(out, interval, backend, vendor=vendor, reason=reason, stop=stop)
    except OSError as exc:     # a full or read-only disk ends the sampling, never the job
        print(f"scaletrain: GPU sampler stopped: cannot write in {args.dir}: {exc.strerror or exc}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
