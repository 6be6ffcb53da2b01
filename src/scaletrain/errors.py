"""One exception hierarchy for scaletrain, each class with its process exit code.

Errors carry a one-line message and a hint that names the fix. The CLI renders them once,
at its edge, as::

    scaletrain: error: <message>
      HINT: <hint>

and exits with ``exit_code``; user errors never show a traceback. Library callers catch
``ScaletrainError`` (or a subclass) like any exception.

Exit codes (one mapping for every verb, ``scaletrain run`` included; README "Errors and exit codes"):
    0      success
    1      a failure at run time: a worker raised or exited non-zero for a reason of its own
           (its own code is in the message, never passed through, so it cannot pass for one
           of the codes below), a collective timed out, a job failed, lint found errors
    2      usage: bad flags or values, unknown cluster/partition, file not found, impossible
           plan; also a UsageError raised inside a worker of ``scaletrain run``
    3      the environment contradicts itself or the job (ranks, GPUs, variables); also a
           DistEnvError raised inside a worker
    4      Slurm is missing or refused the job
    5      ``submit --dry-run`` wrote the run folder and its script, but the check before sbatch
           could not run here (off the cluster: no ``module`` command); it says why
           (``EXIT_NOT_CHECKED``). A dry run the check refuses exits with the refusal's code
           (2: the program cannot be read, 3: the job's environment) and writes the folder too
    75     stopped on purpose at a time limit or preemption after saving its state
           (``scaletrain.contract.environ.EXIT_STOPPED``): requeue, or run again, to resume
    128+N  killed by signal N: a worker (137 = SIGKILL, often out of memory) or
           ``scaletrain run`` itself (130 = Ctrl-C, 143 = SIGTERM)
"""

from __future__ import annotations

import re

EXIT_NOT_CHECKED = 5   # submit --dry-run: written, not checked here (the table above)

# What a terminal acts on instead of showing: C0/C1 controls (ESC starts a sequence that can
# retitle the window, hide text or move the cursor), DEL, and the bidirectional overrides that
# make text read differently from what it is.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, *, keep: str = "") -> str:
    """``text`` safe to print: each control character (except those in ``keep``) shown as its
    escape (``\\x1b``), so text from outside (Slurm, a folder name, a record) cannot drive the
    terminal or break a one-line message."""
    return _UNPRINTABLE.sub(lambda m: m.group() if m.group() in keep else ascii(m.group())[1:-1], text)


class ScaletrainError(Exception):
    """Base class. ``message`` is one line; ``hint`` says how to fix it (may be empty)."""

    exit_code: int = 1

    def __init__(self, message: str, hint: str = "", *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message} HINT: {self.hint}" if self.hint else self.message

    def render(self, prog: str = "scaletrain") -> str:
        """The text the CLI prints: one line, plus one HINT line when there is a hint."""
        # escape sequences from outside text (Slurm, folder names) are shown, not obeyed; a line
        # break some messages carry on purpose (the tail of a failed run's output) is kept
        text = f"{prog}: error: {printable(self.message, keep=chr(10))}"
        if self.hint:
            text += f"\n  HINT: {printable(self.hint)}"
        return text


class UsageError(ScaletrainError):
    """Bad command-line input: a flag value, a missing file, an unknown name."""

    exit_code = 2


class ProfileError(UsageError):
    """A cluster profile is unknown, unreadable or inconsistent."""


class PlanError(UsageError):
    """The request cannot be turned into a job on this cluster (limits, partitions, account)."""


class StrategyError(UsageError):
    """A parallel strategy or precision that cannot run here; the hint names one that can."""


class DistEnvError(ScaletrainError):
    """The process environment contradicts itself or the allocation (ranks, sizes, GPUs)."""

    exit_code = 3


class LaunchError(ScaletrainError):
    """Workers could not be started (port in use, rendezvous failure, no such script)."""

    exit_code = 1


class WorkerFailedError(LaunchError):
    """A worker process exited non-zero or died from a signal."""

    def __init__(self, message: str, hint: str = "", *, exit_code: int = 1,
                 rank: int | None = None) -> None:
        super().__init__(message, hint, exit_code=exit_code)
        self.rank = rank


class SlurmError(ScaletrainError):
    """Slurm's commands are missing, or sbatch/scontrol refused or failed."""

    exit_code = 4
