"""Turn the elastic agent's report of failed workers into one clear error.

When one rank crashes, the agent stops the others (SIGTERM, then SIGKILL) and reports every
non-zero exit, including those it caused itself, and ranks that died because their peer
vanished (gloo "Connection closed by peer"). The user needs the root cause: the first rank
that failed for a reason of its own, its exit code or signal, and the end of its stderr.
A worker that left a structured record in the run folder (a ScaletrainError, a diagnosed
collective timeout) is the root cause before any other, and its record is the message.

The launcher's exit code follows one mapping (README "Errors and exit codes", errors.py):
a worker's ScaletrainError keeps its code (2 usage, 3 environment); a worker that stopped on
purpose after saving keeps 75; a worker killed by signal N gives 128+N; every other failure
(any other exit code, a traceback, a timeout) gives 1, with the worker's own code in the message.
"""

from __future__ import annotations

import signal
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from scaletrain.contract.environ import EXIT_STOPPED
from scaletrain.errors import WorkerFailedError
from scaletrain.launch import crash
from scaletrain.launch.crash import CrashStack
from scaletrain.launch.excerpt import clean, missing_variable_hint, traceback_excerpt
from scaletrain.launch.output import tail_lines
from scaletrain.launch.rundir import ErrorRecord

# Exits the agent's own shutdown causes (negative = killed by that signal; 128+N = a
# Python handler that exited with the conventional code).
_STOPPED_BY_US = {-signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGKILL}

# How a worker that aborts at interpreter exit ends: killed by SIGABRT, 128+SIGABRT through a
# shell, or a launcher's exit(-SIGABRT) truncated to 250 (DeepSpeed's launcher does that).
_ABORTED = {-signal.SIGABRT, 128 + signal.SIGABRT, 256 - signal.SIGABRT}
# The fatal signals faulthandler dumps a stack for
_FATAL = {-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS, -signal.SIGFPE, -signal.SIGILL}
AT_EXIT_HINT = ("the training itself completed. Destroy every process group before the program "
                "ends: torch.distributed.destroy_process_group() once nothing holds a group any "
                "more (DeepSpeed: engine.destroy() and deepspeed.comm.destroy_process_group() "
                "after the function that trains returns); 'scaletrain run' waits for gloo's "
                "threads after the program returns, other launchers do not")

# stderr lines of a rank that failed only because another rank went away first.
_PEER_LOSS_MARKERS = (
    "Connection closed by peer", "Connection reset by peer", "Broken pipe",
    "DistNetworkError", "recvValue failed", "sendBytes failed", "Socket Timeout",
)


@dataclass(frozen=True, kw_only=True)
class FailedRank:
    """One failed worker, as reported by the agent."""

    rank: int
    local_rank: int
    pid: int
    exitcode: int          # negative: killed by signal -exitcode
    stderr_tail: tuple[str, ...] = ()
    record: ErrorRecord | None = None
    finished: bool = False  # its program had returned (the worker entry marked it)
    crash: CrashStack | None = None  # its Python stack, when a fatal signal killed it

    @property
    def how(self) -> str:
        """``exited with code 3`` or ``was killed by SIGSEGV (signal 11)``."""
        if self.exitcode < 0:
            try:
                name = signal.Signals(-self.exitcode).name
            except ValueError:
                name = "an unknown signal"
            return f"was killed by {name} (signal {-self.exitcode})"
        return f"exited with code {self.exitcode}"

    @property
    def aborted_at_exit(self) -> bool:
        """True when the program had returned and the process then aborted: the interpreter's
        exit under a gloo thread still releasing work (pytorch/pytorch#190489)."""
        return self.finished and self.exitcode in _ABORTED

    @property
    def looks_secondary(self) -> bool:
        """True when this rank most likely died because of another rank or of our shutdown."""
        if self.exitcode in _STOPPED_BY_US:
            return True
        return any(m in line for line in self.stderr_tail for m in _PEER_LOSS_MARKERS)


def collect_failures(failures: Mapping[int, object], stderr_paths: Mapping[int, str],
                     tail: int = 40,
                     records: Mapping[int, ErrorRecord] | None = None,
                     finished: Collection[int] = (),
                     crashes: Mapping[int, CrashStack] | None = None) -> list[FailedRank]:
    """``ChildFailedError.failures`` (global rank -> ProcessFailure), in the agent's order,
    each with its error record from the run folder when it left one, whether its program
    had returned (``finished``: the ranks the worker entry marked) and the Python stack a
    fatal signal left (``crashes``)."""
    out = []
    records = records or {}
    crashes = crashes or {}
    for rank, failure in failures.items():
        local_rank = int(getattr(failure, "local_rank"))
        out.append(FailedRank(
            rank=int(rank), local_rank=local_rank, pid=int(getattr(failure, "pid")),
            exitcode=int(getattr(failure, "exitcode")),
            stderr_tail=tuple(tail_lines(stderr_paths.get(local_rank), tail)),
            record=records.get(int(rank)), finished=int(rank) in finished,
            # only for a rank a fatal signal ended: the dump of an earlier attempt stays in the
            # file and says nothing about a rank the agent stopped
            crash=crashes.get(int(rank)) if int(getattr(failure, "exitcode")) in _FATAL else None,
        ))
    return out


def root_cause(failed: list[FailedRank]) -> FailedRank:
    """The rank to blame: one that raised a ScaletrainError, then one whose collective timed
    out (its record names who did not arrive), then the first failure that is not a
    consequence of another (the agent lists them in order)."""
    for kind in ("error", "timeout"):
        for item in failed:
            if item.record is not None and item.record.kind == kind:
                return item
    for item in failed:
        if not item.looks_secondary:
            return item
    return failed[0]


def exit_code_for(item: FailedRank) -> int:
    """The launcher's exit code for a root cause (the mapping in the module doc)."""
    if item.record is not None:
        return item.record.exit_code if item.record.exit_code in (1, 2, 3, 4) else 1
    if item.exitcode == EXIT_STOPPED:
        return EXIT_STOPPED
    if item.exitcode < 0:
        return 128 + (-item.exitcode)
    return 1


def describe(item: FailedRank) -> str:
    """``rank 1 exited with code 3``, or the record's message: for a restart notice."""
    if item.record is not None:
        return f"rank {item.rank}: {item.record.message}"
    return f"rank {item.rank} {item.how}"


def render_tail(item: FailedRank, *, shown: bool = True) -> str:
    """The block printed before the error line. ``shown``: the console showed the rank's lines
    as they came; then a traceback is not printed again: the block is the program's own line
    that raised and the error (:func:`~scaletrain.launch.excerpt.traceback_excerpt`). A rank
    whose lines were kept off the console (``--ranks 0``) gets its last lines."""
    if item.record is not None:
        where = f" at {item.record.where}" if item.record.where else ""
        what = "timed out" if item.record.kind == "timeout" else f"raised {item.record.type}"
        return f"scaletrain: rank {item.rank} {what}{where}"
    excerpt = traceback_excerpt(item.stderr_tail) if shown else None
    if not item.stderr_tail:
        text = f"scaletrain: rank {item.rank} wrote nothing to stderr"
    elif excerpt is not None:
        where = f" at {excerpt.where}" if excerpt.where else ""
        lines = ([f"  |     {excerpt.code}"] if excerpt.code else []) + \
            [f"  | {line}" for line in excerpt.error]
        text = f"scaletrain: rank {item.rank} failed{where}:\n" + "\n".join(lines)
    else:
        body = "\n".join(f"  | {line}" for line in clean(item.stderr_tail)[-_TAIL_SHOWN:])
        text = f"scaletrain: last lines of rank {item.rank}'s stderr:\n{body}"
    if item.crash is not None:
        text += "\n" + crash.render(item.rank, item.crash)
    return text


_TAIL_SHOWN = 15   # lines of a failed rank's stderr printed when it has no traceback to excerpt


def worker_failed_error(failed: list[FailedRank], node_rank: int = 0, *,
                        emulate: str | None = None) -> WorkerFailedError:
    """The one-line error for the root cause, naming the rank, and what happened to the rest
    (``emulate``: the run's ``--emulate`` mode, for a rank that missed a launcher variable)."""
    cause = root_cause(failed)
    if cause.record is not None:
        return WorkerFailedError(cause.record.message, cause.record.hint,
                                 exit_code=exit_code_for(cause), rank=cause.rank)
    rest = "; the other workers were stopped"
    where = f" on node {node_rank}" if node_rank else ""
    who = f"rank {cause.rank} (local rank {cause.local_rank}{where}, pid {cause.pid})"
    if cause.aborted_at_exit:
        return WorkerFailedError(
            f"{who} finished its program, then aborted while Python shut down ({cause.how}; "
            "'terminate called without an active exception': a gloo process group's thread "
            "was still releasing work at exit)", AT_EXIT_HINT,
            exit_code=exit_code_for(cause), rank=cause.rank)
    message = f"{who} {cause.how}{rest}"
    if cause.exitcode < 0 and -cause.exitcode == signal.SIGKILL:
        hint = "SIGKILL often means out of memory (check `dmesg`); use a smaller batch or fewer ranks"
    elif cause.crash is not None:
        hint = ("a crash inside native code (torch, a communication library or a C extension): "
                "the stack above shows which call of the program was running")
    else:
        hint = (missing_variable_hint(cause.stderr_tail, emulate)
                or ("the lines above are the program's line that raised and its error; fix it "
                    "and run again" if traceback_excerpt(cause.stderr_tail) is not None
                    else "the lines above are that rank's stderr; fix the error and run again"))
    return WorkerFailedError(message, hint, exit_code=exit_code_for(cause), rank=cause.rank)
