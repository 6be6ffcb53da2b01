"""A ``ScaletrainError`` that escapes the user's program: one line, its hint, its exit code.

Under ``scaletrain run`` the worker catches it (launch/inproc/worker.py). A program started by
``srun python3 -u train.py`` (what the default launcher writes), by torchrun or directly has no
such wrapper: Python printed a traceback and exited 1. :func:`install` (called first thing by
``scaletrain.init()``) chains an excepthook that renders our errors the way the CLI does and
exits with their documented code; every other exception goes to the hook that was there before
(Python's, or the user's own), untouched.

The exit code: Python exits 1 after any excepthook, so the hook runs the ``atexit`` handlers
itself (the process group's shutdown, logging's flush), flushes the standard streams and ends
the process with ``os._exit(code)``.

The chain must stay a chain. torch's ``init_process_group`` wraps whatever hook is installed
(its ``[rankN]:`` prefix), so after a second ``init()`` the hook before ours would be torch's
wrapper of ours: each called the other until Python's recursion limit (~2000 lines of
traceback). :func:`install` therefore chains once per process, and a hook entered again while
it is already running on the same thread hands the error to Python's own printer.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from types import TracebackType
from typing import Callable

from scaletrain import module_state
from scaletrain.errors import ScaletrainError
from scaletrain.torch_features import run_atexit_handlers

_Hook = Callable[[type[BaseException], BaseException, "TracebackType | None"], object]
_PREVIOUS: _Hook | None = None
_INSTALLED = False
module_state.register(__name__, "_PREVIOUS", "_INSTALLED")
_ACTIVE = threading.local()   # .inside: this thread is running hook() now


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass   # a closed or broken stream: nothing more can be said on it


def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """``sys.excepthook`` for scaletrain's errors; others go to the previous hook."""
    if getattr(_ACTIVE, "inside", False):   # the chain came back to us: never loop
        sys.__excepthook__(kind, exc, tb)
        return
    _ACTIVE.inside = True
    try:
        _handle(kind, exc, tb)
    finally:
        _ACTIVE.inside = False


def _handle(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    previous = _PREVIOUS or sys.__excepthook__
    if not isinstance(exc, ScaletrainError):
        previous(kind, exc, tb)
        return
    from scaletrain.runtime.current import error_rank

    rank = error_rank()
    text = exc.render()
    if rank is not None:
        text = text.replace("scaletrain: error:", f"scaletrain: error: rank {rank}:", 1)
    # torch's wrapper hands us a StringIO as stderr and prints it once we return; we never
    # return (os._exit below), so our line goes to the real stream
    stream = sys.__stderr__ if isinstance(sys.stderr, io.StringIO) else sys.stderr
    try:
        print(text, file=stream)
    except (OSError, ValueError, AttributeError):
        pass
    _flush()
    try:
        run_atexit_handlers()
    finally:
        _flush()
        os._exit(exc.exit_code)


def install() -> None:
    """Chain :func:`hook` in front of the current ``sys.excepthook`` (once per process)."""
    global _PREVIOUS, _INSTALLED
    if _INSTALLED or sys.excepthook is hook:
        return   # already in the chain, perhaps wrapped by torch's since: chaining again loops
    _PREVIOUS = sys.excepthook
    sys.excepthook = hook
    _INSTALLED = True


__all__ = ["hook", "install"]
