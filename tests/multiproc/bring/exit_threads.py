"""Run a program as ``python PROGRAM ARGS`` would, and record the gloo worker threads that are
still alive when the interpreter exits - and whether each ever ran a collective.

    exit_threads.py OUT_DIR PROGRAM ARGS...

Writes OUT_DIR/rank-N.json: ``after_init`` (the default group's worker threads right after
``init_process_group``, with their voluntary context switches) and ``at_exit`` (every gloo
worker thread alive in an atexit handler, with its switches). A worker thread that never ran a
work still shows the switches it had after init; one that did cannot be told apart from one
still releasing a finished work when Python shuts down - the abort at exit.
"""

import atexit
import json
import os
import runpy
import sys
from pathlib import Path

out, program = Path(sys.argv[1]), sys.argv[2]
sys.argv = sys.argv[2:]
seen: dict[str, dict[str, str]] = {}


def _gloo_workers() -> dict[str, str]:
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            if Path(f"/proc/self/task/{tid}/comm").read_text().strip() != "pt_gloo_runloop":
                continue
            status = Path(f"/proc/self/task/{tid}/status").read_text().splitlines()
        except OSError:
            continue
        found[tid] = next(line.split(":", 1)[1].strip() for line in status
                          if line.startswith("voluntary_ctxt_switches"))
    return found


def _record() -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{os.environ.get('RANK', '0')}.json").write_text(json.dumps(
        {"after_init": seen.get("after_init", {}), "at_exit": _gloo_workers()}))


atexit.register(_record)   # registered first: runs after every handler the program adds
import torch.distributed as dist  # noqa: E402

_init = dist.init_process_group


def _recording_init(*args, **kwargs):
    result = _init(*args, **kwargs)
    seen.setdefault("after_init", _gloo_workers())
    return result


dist.init_process_group = _recording_init
sys.path[0] = os.path.dirname(os.path.abspath(program))
runpy.run_path(program, run_name="__main__")
