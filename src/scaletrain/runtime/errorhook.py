"""A ``ScaletrainError`` that escapes the user's program: one line, its hint, its exit code.

Under ``scaletrain run`` the worker catches it (launch/worker.py). A program started by
``srun python3 -u train.py`` (what the default launcher writes), by torchrun or directly has no
such wrapper: Python printed a traceback and exited 1. :func:`install` (called first thing by
``scaletrain.init()``) chains an excepthook that renders our errors the way the CLI does and
exits with their documented code; every other exception goes to the hook that was there before
(Python's, or the user's own), untouched.

The exit code: Python exits 1 after any excepthook, so the hook runs the ``atexit`` handlers
itself (the process group's shutdown, logging's flush), flushes the standard streams and ends
the process with ``os._exit(code)``.
"""

from __future__ import annotations

import atexit
import os
import sys
from types import TracebackType
from typing import Callable

from scaletrain.errors import ScaletrainError

_Hook = Callable[[type[BaseException], BaseException, "TracebackType | None"], object]
_PREVIOUS: _Hook | None = None


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass   # a closed or broken stream: nothing more can be said on it


def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """``sys.excepthook`` for scaletrain's errors; others go to the previous hook."""
    previous = _PREVIOUS or sys.__excepthook__
    if not isinstance(exc, ScaletrainError):
        previous(kind, exc, tb)
        return
    from scaletrain.runtime.current import error_rank

    rank = error_rank()
    text = exc.render()
    if rank is not None:
        text = text.replace("scaletrain: error:", f"scaletrain: error: rank {rank}:", 1)
    try:
        print(text, file=sys.stderr)
    except (OSError, ValueError):
        pass
    _flush()
    try:
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(exc.exit_code)


def install() -> None:
    """Chain :func:`hook` in front of the current ``sys.excepthook`` (once; idempotent)."""
    global _PREVIOUS
    if sys.excepthook is hook:
        return
    _PREVIOUS = sys.excepthook
    sys.excepthook = hook


__all__ = ["hook", "install"]
