"""The launcher's own process: no garbage collection while torch loads, no teardown at exit.

`scaletrain run` imports torch only to run its elastic agent, and two costs of that import
are pure overhead in a process that holds no training state (issue 23, measured on the
2-core CPU machine of docs/benchmarks.md, the same in torchrun):

- while torch is imported, Python's cyclic collector runs ~380 times, three of them full
  collections over a growing heap: 0.13 s before the first worker starts. Nothing torch's
  import creates is garbage, so the collector is paused until the imports are done, then the
  imported objects are frozen (``gc.freeze``: later collections skip them) and it runs again;
- at exit the interpreter tears down torch's ~1M objects module by module: 0.24 s after the
  last worker has ended, before the shell gets its prompt back. The launcher's files are
  closed and its folders removed before that point, so :func:`leave` ends the process the way
  Python's exit does (non-daemon threads joined, ``atexit`` handlers run, standard streams
  flushed) and skips only the teardown.

Only the CLI turns these on (:func:`cli_launch`): ``launch()`` called from a Python program
leaves that program's collector and exit alone. Nothing here imports torch.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from scaletrain import module_state
from scaletrain.torch_features import python_exit_steps

_STATE = {"cli": False, "collector_paused": False, "skip_teardown": False}
module_state.register(__name__, "_STATE")


@contextmanager
def cli_launch() -> Iterator[None]:
    """The block of ``scaletrain run``'s verb, entered before torch is imported.

    The collector is paused until :func:`imports_done` (and as it was after the block, if the
    block ends first: a usage error, or a test calling the verb in its own process).
    """
    _STATE["cli"] = True
    if gc.isenabled():
        gc.disable()
        _STATE["collector_paused"] = True
    try:
        yield
    finally:
        _STATE["cli"] = False
        if _STATE["collector_paused"]:
            _STATE["collector_paused"] = False
            gc.enable()


def imports_done(*, skip_teardown: bool = True) -> None:
    """After torch's modules are imported: freeze what they made, and collect again; within
    :func:`cli_launch`, also let :func:`leave` skip the teardown unless ``skip_teardown`` is
    False (the launch's adapter left the patch off: torch as it is, or CPython's exit steps
    missing). A no-op outside it."""
    if _STATE["collector_paused"]:
        _STATE["collector_paused"] = False
        gc.freeze()
        gc.enable()
    if _STATE["cli"]:
        _STATE["skip_teardown"] = skip_teardown


def leave(code: int) -> NoReturn:
    """Exit with ``code``; once torch is imported under :func:`cli_launch`, without tearing
    the interpreter down.

    The exit otherwise matches ``sys.exit(code)``: threads joined, ``atexit`` handlers run,
    stdout and stderr flushed. Where a step is not available (another Python) or flushing
    fails (a closed pipe, for the interpreter to report), it is a plain ``sys.exit``.
    """
    if not _STATE["skip_teardown"]:
        sys.exit(code)
    steps = python_exit_steps()  # CPython's privates, looked up in scaletrain.torch_features
    if steps is None:
        sys.exit(code)
    shutdown, run_exit_handlers = steps
    shutdown()            # joins non-daemon threads, as the interpreter's exit does first
    run_exit_handlers()   # then the atexit handlers (logging's flush, weakref finalizers)
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)
