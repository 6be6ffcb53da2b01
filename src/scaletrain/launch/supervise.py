"""What `scaletrain run` adds to torch's agent around failures: the run folder, which
failures are worth a restart, and the environment that lets workers die with the agent.

- The run folder (``--run-dir``, else a temporary one) receives the workers' error records
  and, after a hang, every rank's stack (:mod:`scaletrain.launch.rundir`). A temporary folder
  is removed at the end unless it holds stacks, whose path the error message gives.
- ``--max-restarts K`` restarts the workers after a crash, and they resume from their latest
  checkpoint (``Checkpointer.load_latest``). Some failures would only repeat: a worker that
  stopped on purpose after saving (exit 75, a time limit or preemption: the job should end
  and be requeued) and a ScaletrainError of usage or environment (a wrong flag stays
  wrong). Those end the run at once instead of burning the restarts.

torch builds its ``LocalElasticAgent`` inside ``elastic_launch``; :func:`supervised_agent`
substitutes a subclass for the duration of one launch (the launcher is its own process, and
the substitution is undone on return).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from scaletrain.contract import AGENT_PID_VAR, EXIT_STOPPED, RUN_DIR_VAR
from scaletrain.launch import rundir

# A record of these exit codes means the same input would fail the same way again.
_DETERMINISTIC = (2, 3)


@contextmanager
def run_folder(requested: str | None) -> Iterator[str]:
    """The run folder for one launch: ``requested`` (created, kept), or a temporary one
    removed at the end unless a hang left stacks in it."""
    if requested:
        Path(requested).mkdir(parents=True, exist_ok=True)
        yield os.path.abspath(requested)
        return
    path = tempfile.mkdtemp(prefix="scaletrain_rundir_")
    try:
        yield path
    finally:
        if not rundir.has_stacks(path):
            shutil.rmtree(path, ignore_errors=True)


def worker_environ(run_dir: str) -> dict[str, str]:
    """Variables every worker gets from this launch (beyond the plan's own)."""
    return {RUN_DIR_VAR: run_dir, AGENT_PID_VAR: str(os.getpid())}


def no_restart_reason(failures: Mapping[int, object], run_dir: str) -> str | None:
    """Why restarting after ``failures`` (rank -> ProcessFailure) would be pointless, or None."""
    for rank, failure in sorted(failures.items()):
        if int(getattr(failure, "exitcode", 0)) == EXIT_STOPPED:
            return (f"rank {rank} stopped on purpose after saving (exit {EXIT_STOPPED}); "
                    "not restarting")
    for rank, record in sorted(rundir.read_errors(run_dir).items()):
        if record.kind == "error" and record.exit_code in _DETERMINISTIC:
            return f"rank {rank}: {record.message}; a restart would fail the same way"
    return None


@contextmanager
def supervised_agent(run_dir: str,
                     describe: Callable[[Mapping[int, object]], str]) -> Iterator[None]:
    """Make ``elastic_launch`` use an agent that skips pointless restarts and says when it restarts.

    ``describe(failures)`` returns the one-line cause printed before a restart.
    """
    import torch.distributed.launcher.api as api

    base = api.LocalElasticAgent

    class _Agent(base):  # type: ignore[misc, valid-type]
        def _monitor_workers(self, worker_group):  # type: ignore[no-untyped-def]
            result = super()._monitor_workers(worker_group)
            if result.is_failed() and self._remaining_restarts > 0:
                reason = no_restart_reason(result.failures, run_dir)
                if reason is not None:
                    self._remaining_restarts = 0
                    print(f"scaletrain: {reason}", file=sys.stderr, flush=True)
                else:
                    left = self._remaining_restarts - 1
                    print(f"scaletrain: {describe(result.failures)}; restarting all workers "
                          f"({left} restart(s) left after this one); they resume from their "
                          "latest checkpoint", file=sys.stderr, flush=True)
                    rundir.clear_errors(run_dir)
            return result

    api.LocalElasticAgent = _Agent
    try:
        yield
    finally:
        api.LocalElasticAgent = base
