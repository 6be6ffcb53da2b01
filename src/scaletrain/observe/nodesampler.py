"""``python -m scaletrain.observe.nodesampler DIR``: one light GPU sampler per node, for any program.

A program that does not use the Monitor still deserves a report of what its GPUs did. With
``plan/submit --sample-gpus S`` the generated job starts this module once per node in the
background (``srun --overlap``, one task per node), before the program. Every ``S`` seconds it
reads every GPU of the node through NVML or AMD SMI (the Monitor's backends,
:mod:`scaletrain.observe.devices`; no torch) and appends one JSON line to
``DIR/gpus-<host>.jsonl``::

    {"type": "sampler", "host": "g1101", "interval_s": 10, "backend": "nvidia"}   (or "reason")
    {"t": 1764031200.1, "devices": {"0": {"util_pct": 97.0, "mem_gb": 61.2, "power_w": 402.0}, ...}}

It stops on SIGTERM (the end of the job) or when the node has no GPU it can read (one line that
says why, then exit 0: a sampler never fails a job). ``scaletrain report`` reads these files.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from scaletrain.contract.files import GPU_SAMPLES_PREFIX
from scaletrain.errors import UsageError
from scaletrain.fileio import json_text
from scaletrain.observe.devices import Backend, open_backend

VENDORS = ("nvidia", "amd")


def first_backend() -> tuple[Backend | None, str, str]:
    """(backend, vendor, reason): the first vendor whose library reads this node's GPUs."""
    reasons = []
    for vendor in VENDORS:
        backend, reason = open_backend(vendor)
        if backend is not None:
            return backend, vendor, ""
        reasons.append(f"{vendor}: {reason}")
    return None, "", "; ".join(reasons)


def sample_loop(out_dir: Path, interval_s: float, backend: Backend | None, *, vendor: str = "",
                reason: str = "", host: str | None = None, stop: threading.Event | None = None,
                max_samples: int | None = None) -> Path:
    """Append the header line, then a line per reading until ``stop`` is set; returns the file."""
    host = host or socket.gethostname()
    stop = stop or threading.Event()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{GPU_SAMPLES_PREFIX}{host}.jsonl"
    head: dict[str, Any] = {"type": "sampler", "host": host, "interval_s": interval_s}
    head.update({"backend": vendor} if backend is not None else {"reason": reason or "no GPU backend"})
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
            line = {"t": round(time.time(), 3), "devices": {str(k): asdict(v) for k, v in readings.items()}}
            fh.write(json_text(line) + "\n")
            fh.flush()             # whole lines only: a reader never sees half of one
            taken += 1
            if max_samples is not None and taken >= max_samples:
                break
            stop.wait(interval_s)
    if backend is not None:
        backend.close()
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: ``DIR [--interval S]``; SIGTERM ends the loop."""
    parser = argparse.ArgumentParser(prog="python -m scaletrain.observe.nodesampler",
                                     description="Sample this node's GPUs into DIR/gpus-<host>.jsonl")
    parser.add_argument("dir")
    parser.add_argument("--interval", type=float, default=10.0)
    args = parser.parse_args(argv)
    out = Path(args.dir)
    if out.exists() and not out.is_dir():
        print(UsageError(f"{args.dir} is not a folder: the sampler writes gpus-<host>.jsonl into a "
                         "folder", "give the run folder (it is created if missing)").render(),
              file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    backend, vendor, reason = first_backend()
    try:
        sample_loop(out, max(1.0, args.interval), backend, vendor=vendor, reason=reason, stop=stop)
    except OSError as exc:     # a full or read-only disk ends the sampling, never the job
        print(f"scaletrain: GPU sampler stopped: cannot write in {args.dir}: {exc.strerror or exc}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
