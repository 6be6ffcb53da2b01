"""What a rank was running when it crashed in native code (a segfault, an abort, heap corruption).

A rank killed by SIGSEGV or SIGABRT raises no Python exception: its stderr ends with one line
from the C library ("malloc(): unaligned tcache chunk detected", "Segmentation fault") and says
nothing about which line of the program ran. The worker entry enables ``faulthandler`` into the
rank's stack file in the run folder (:func:`scaletrain.launch.inproc.hang.install_stack_dump`), so a
fatal signal leaves a "Fatal Python error" dump there; :func:`crash_stack` reads the frames of
the thread that crashed (or, when the crash came from a thread that runs no Python - a
communication library's own thread - the main thread's), and the launcher prints them under the
rank's stderr. The run folder is then kept, so the whole dump can be read after the run.

Imports neither torch nor anything that does: the launcher reads it after its workers ended.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from scaletrain.fileio import read_tail
from scaletrain.launch import frames, rundir

FRAMES_SHOWN = 8
_FATAL = "Fatal Python error:"
_BLOCK_RE = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.MULTILINE)
_FRAME_RE = re.compile(r'^\s+File "(?P<path>.*)", line \d+ in .*$')


@dataclass(frozen=True)
class CrashStack:
    """The fatal error's name and the frames shown for it, innermost first."""

    error: str                  # "Aborted", "Segmentation fault"
    thread: str                 # "the thread that crashed" or "the main thread"
    frames: tuple[str, ...]     # 'File "train.py", line 12 in step', at most FRAMES_SHOWN
    path: str                   # the whole dump


def parse(text: str, main_thread: int | None = None) -> tuple[str, str, tuple[str, ...]] | None:
    """(error, which thread, frames) from the last fatal-error dump in ``text``; None if none."""
    start = text.rfind(_FATAL)
    if start < 0:
        return None
    dump = text[start:]
    error = dump[len(_FATAL):].splitlines()[0].strip() or "unknown"
    blocks = {}  # "current" / thread id in hex -> its frame lines
    matches = list(_BLOCK_RE.finditer(dump))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(dump)
        lines = _without_entry(dump[match.end():end].splitlines())
        key = "current" if match.group(1) == "Current thread" else match.group(2)
        blocks[key] = tuple(lines)
        if key == "current":
            blocks.setdefault(match.group(2), tuple(lines))
    if blocks.get("current"):
        return error, "the thread that crashed", blocks["current"][:FRAMES_SHOWN]
    main = f"0x{main_thread:016x}" if main_thread else None
    if main and blocks.get(main):
        return error, "the main thread (the crash came from a thread with no Python code)", \
            blocks[main][:FRAMES_SHOWN]
    return error, "no Python thread", ()


def _without_entry(lines: list[str]) -> tuple[str, ...]:
    """The frame lines of one thread, less the outermost ones of the worker entry and runpy
    that every rank's stack ends with."""
    found = [(ln.strip(), m["path"]) for ln in lines if (m := _FRAME_RE.match(ln))]
    while found and (found[-1][1].startswith("<frozen runpy")
                     or frames.in_package(found[-1][1], "scaletrain", "launch")):
        found.pop()
    return tuple(line for line, _ in found)


def crash_stack(run_dir: str | os.PathLike[str], rank: int) -> CrashStack | None:
    """Rank ``rank``'s fatal-error dump in the run folder, or None when it left none."""
    path = rundir.stack_path(run_dir, rank)
    try:
        text = read_tail(path).decode("utf-8", errors="replace")   # the fatal thread's stack ends it
    except OSError:
        return None
    info = rundir.read_rank_infos(run_dir).get(rank)
    parsed = parse(text, info.thread if info else None)
    if parsed is None:
        return None
    return CrashStack(parsed[0], parsed[1], parsed[2], str(path))


def render(rank: int, crash: CrashStack) -> str:
    """The block printed under a crashed rank's stderr."""
    head = (f"scaletrain: rank {rank} crashed in native code ({crash.error}); Python stack of "
            f"{crash.thread}, most recent call first:")
    body = "\n".join(f"  | {line}" for line in crash.frames) or "  | (no Python frame)"
    return f"{head}\n{body}\n  the whole dump: {crash.path}"
