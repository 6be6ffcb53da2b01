"""What every worker `scaletrain run` starts runs: ``python -m scaletrain.launch.worker [-m] TARGET ARGS``
(that thin module hands over to :func:`main` here).

It runs the user's script (or module) exactly as ``python SCRIPT ARGS`` would (``__main__``,
``sys.argv``, ``sys.path[0]``), with five additions that only a process of our own can give:

- it dies with its agent: ``PR_SET_PDEATHSIG`` makes the kernel SIGKILL the worker when
  `scaletrain run` dies, even by ``kill -9`` (torch's agent puts workers in their own session,
  so nothing else would reach them and they would train on as orphans);
- it answers a stack request (:mod:`scaletrain.launch.inproc.hang`), for hang forensics;
- a ``ScaletrainError`` (a bad strategy, batch size, environment) becomes a structured record
  in the run folder, rendered by the launcher as one line, a HINT and its exit code; the
  user's own errors keep their full traceback (minus this wrapper's frames);
- a collective that times out is diagnosed: the record names the ranks that did not arrive;
- when the program returns it marks the run folder (a crash after that happened while Python
  shut down) and waits for gloo's worker threads to go idle, so the exit cannot abort under them.

Nothing here imports torch; the script does.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
import threading
import traceback
from types import TracebackType

from scaletrain.contract.environ import AGENT_PID_VAR, RUN_DIR_VAR
from scaletrain.errors import ScaletrainError
from scaletrain.launch import frames, rundir
from scaletrain.launch.inproc import hang

_PR_SET_PDEATHSIG = 1
# The frames above the user's program: this file, the entry module that calls it and runpy's (by
# their real paths, so a user's own "myrunpy.py" is never taken for one of them)
ENTRY_MODULE = "scaletrain.launch.worker"
_OUR_FILES = frozenset({os.path.realpath(__file__), os.path.realpath(runpy.__file__ or "runpy.py"),
                        os.path.realpath(os.path.join(os.path.dirname(__file__), os.pardir, "worker.py")),
                        "<frozen runpy>"})


def worker_args(args: tuple[str, ...]) -> tuple[str, ...]:
    """The interpreter arguments that run ``args`` (``-u SCRIPT ...`` / ``-u -m MOD ...``) here."""
    rest = args[1:] if args[:1] == ("-u",) else args
    return ("-u", "-m", ENTRY_MODULE, *rest)


def die_with_parent(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Ask the kernel to SIGKILL this process when its parent (the agent) dies. Linux only.

    The agent may have died between our fork and this call: then our parent is already
    someone else (init or a subreaper) and we exit at once.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):  # not Linux
        return False
    expected = environ.get(AGENT_PID_VAR, "")
    if expected.isdigit() and os.getppid() != int(expected):
        os._exit(128 + int(signal.SIGKILL))
    return True


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """Drop this wrapper's and runpy's frames from the top of a traceback."""
    while tb is not None and _is_wrapper(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _is_wrapper(path: str) -> bool:
    return path in _OUR_FILES or (not path.startswith("<") and os.path.realpath(path) in _OUR_FILES)


def _where(tb: TracebackType | None) -> str:
    """The user's line: the innermost frame outside scaletrain's and torch's installed folders."""
    for frame in reversed(traceback.extract_tb(tb)):
        if frames.is_user_frame(frame.filename):
            return f"{frames.short_path(frame.filename)}:{frame.lineno} in {frame.name}"
    return ""


def _report(record: rundir.ErrorRecord, run_dir: str | None, text: str) -> None:
    """Leave ``record`` for the launcher; print ``text`` only when no launcher will read it."""
    if run_dir:
        try:
            rundir.write_error(run_dir, record)
            return
        except OSError:
            pass
    print(text, file=sys.stderr, flush=True)


def _run(target: list[str]) -> None:
    if target[:1] == ["-m"]:
        module, argv = target[1], target[2:]
        sys.argv = [module, *argv]  # run_module(alter_sys=True) sets argv[0] to the file
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, argv = target[0], target[1:]
        sys.argv = [script, *argv]
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` does
        runpy.run_path(script, run_name="__main__")


def main(target: list[str]) -> int:
    """Run ``target`` (``SCRIPT ARGS`` or ``-m MODULE ARGS``); returns the exit code."""
    die_with_parent()
    run_dir = os.environ.get(RUN_DIR_VAR) or None
    rank = int(os.environ.get("RANK", "0") or 0)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    stack_file = hang.install_stack_dump(run_dir, rank, attempt) if run_dir else None
    worker = os.getpid()

    def forked() -> bool:
        """A child the program forked (``os.fork``) and left through the program's frames, up
        to here: the run folder's records and stack file are its parent's, not its own."""
        return os.getpid() != worker

    returned = False
    try:
        _run(target)
        returned = True
    except SystemExit as exc:
        if (exc.code is None or exc.code == 0) and not forked():
            returned = True
            _finished(run_dir, rank)
        raise
    except ScaletrainError as exc:
        if forked():
            raise
        tb = _user_traceback(exc.__traceback__)
        _report(rundir.ErrorRecord(rank=rank, kind="error", type=type(exc).__name__,
                                   message=exc.message, hint=exc.hint, exit_code=exc.exit_code,
                                   where=_where(tb), attempt=attempt),
                run_dir, exc.render())
        return exc.exit_code
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        if forked():
            raise
        tb = _user_traceback(exc.__traceback__)
        if run_dir and hang.is_collective_timeout(exc):
            world = int(os.environ.get("WORLD_SIZE", "1") or 1)
            record = hang.diagnose(exc.with_traceback(tb), run_dir=run_dir, rank=rank,
                                   world_size=world, attempt=attempt, own_stack=stack_file,
                                   waited_s=_configured_timeout())
            stack_file = None  # it holds the dump: keep it
            _report(record, run_dir, f"scaletrain: error: {record.message}\n  HINT: {record.hint}")
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # printers read __traceback__
        return 1
    finally:
        if not forked():   # a forked child would close and remove its parent's stack file
            hang.remove_if_empty(stack_file, keep_handler=returned)
    if not forked():
        _finished(run_dir, rank)
    return 0


def _finished(run_dir: str | None, rank: int) -> None:
    """The program returned: say so in the run folder (a crash from now on happened while the
    interpreter shut down), then let gloo's worker threads go idle before it does (torch
    aborts the process when one is still releasing work at exit, see runtime/settle.py)."""
    if run_dir:
        try:
            rundir.write_finished(run_dir, rank, _threads())
        except OSError:
            pass
    # imported only now: while the program runs, nothing of scaletrain's runtime is loaded in it
    from scaletrain.runtime import settle

    settle.settle_gloo_workers()


def _threads() -> list[rundir.ThreadInfo]:
    """The Python threads alive besides the main one: the non-daemon ones are what the
    interpreter's exit waits for (the launcher names them when the exit does not end)."""
    main = threading.main_thread()
    return [rundir.ThreadInfo(ident=t.ident or 0, native_id=t.native_id or 0, name=t.name,
                              daemon=t.daemon)
            for t in threading.enumerate() if t is not main and t.is_alive()]


def _configured_timeout() -> float | None:
    timeouts = sys.modules.get("scaletrain.runtime.timeouts")
    if timeouts is None:
        return None
    return timeouts.current_step_timeout() if timeouts.is_started() else None

