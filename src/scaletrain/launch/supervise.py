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
has a subclass substituted for the duration of one launch (the launcher is its own process,
and the substitution is undone on return; the patch itself is in :mod:`scaletrain.launch.patches`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from scaletrain.contract.environ import AGENT_PID_VAR, EXIT_STOPPED, RUN_DIR_VAR
from scaletrain.fileio import writable_dir
from scaletrain.launch import rundir
from scaletrain.launch.adapter import FORENSICS, RESTART_COUNT, RESTARTS, Adapter, restart_count
from scaletrain.launch.inproc import hang
from scaletrain.launch.failure import FailedRank, describe, root_cause
from scaletrain.launch.output import tail_lines
from scaletrain.launch.patches import agent_hooks

# A record of these exit codes means the same input would fail the same way again.
_DETERMINISTIC = (2, 3)


@contextmanager
def run_folder(requested: str | None) -> Iterator[str]:
    """The run folder for one launch: ``requested`` (created, kept), or a temporary one
    removed at the end unless a hang left stacks in it."""
    if requested:
        writable_dir(requested, "--run-dir")   # one line before any worker starts, not a traceback
        try:
            yield os.path.abspath(requested)
        finally:
            rundir.drop_empty_stacks(requested)
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
    finished = rundir.read_finished(run_dir)
    for rank in sorted(failures):
        if int(rank) in finished:  # it crashed while Python shut down: training had completed
            return (f"rank {rank} failed after its program had finished; not restarting a "
                    "completed training")
    return None


def diagnose_before_close(handlers: Mapping[int, Any], stderrs: Mapping[int, str],
                          run_dir: str, world_size: int) -> bool:
    """Before torch's process context stops the survivors of a failure: if a worker died of a
    collective timeout without a record (NCCL's watchdog aborts the process, so the worker
    entry never sees an exception), ask the survivors of this node for their stacks while
    they still live, and write the record naming who did not arrive. True when written.

    ``handlers``: local rank -> torch's SubprocessHandler (``.proc`` is the Popen);
    ``stderrs``: local rank -> the worker's stderr file.
    """
    if rundir.read_errors(run_dir):
        return False  # a worker diagnosed it itself
    infos = {info.pid: info for info in rundir.read_rank_infos(run_dir).values()}
    dead = {lr: h.proc.pid for lr, h in handlers.items() if h.proc.poll() not in (None, 0)}
    dead_ranks = {infos[pid].rank for pid in dead.values() if pid in infos}
    for local_rank, pid in sorted(dead.items()):
        info = infos.get(pid)
        if info is not None and hang.died_of_timeout(tail_lines(stderrs.get(local_rank), 15)):
            record = hang.diagnose_dead(info.rank, run_dir=run_dir, world_size=world_size,
                                        attempt=info.attempt, dead=dead_ranks)
            rundir.write_error(run_dir, record)
            return True
    return False


def supervised_agent(run_dir: str, failures: Callable[[Mapping[int, object]], list[FailedRank]],
                     world_size: int, adapter: Adapter, max_restarts: int
                     ) -> AbstractContextManager[None]:
    """Make ``elastic_launch`` use an agent that skips pointless restarts and says when it
    restarts, and a process context that diagnoses silent timeouts before it stops workers
    (installed by :func:`scaletrain.launch.patches.agent_hooks`), each where ``adapter``
    found the names it needs (:data:`~scaletrain.launch.adapter.RESTARTS`, ``FORENSICS``).

    ``failures(report)`` turns the agent's report (global rank -> ProcessFailure) into
    FailedRanks with their stderr tails and records. ``max_restarts``: the count an agent
    gets where torch's ``__init__`` left it none (see ``agent_hooks``).
    """

    def before_close(ctx: Any) -> None:
        try:
            diagnose_before_close(getattr(ctx, "subprocess_handlers", {}),
                                  getattr(ctx, "stderrs", {}), run_dir, world_size)
        except Exception as exc:  # forensics must never stop the shutdown
            print(f"scaletrain: could not collect the ranks' stacks: {exc}", file=sys.stderr)

    def after_monitor(agent: Any, result: Any) -> None:
        remaining = restart_count(agent)  # the agent hook found it on this very object
        if remaining is not None and result.is_failed() and remaining > 0:
            reason = no_restart_reason(result.failures, run_dir)
            if reason is not None:
                setattr(agent, RESTART_COUNT, 0)
                print(f"scaletrain: {reason}", file=sys.stderr, flush=True)
            else:
                left = remaining - 1
                cause = describe(root_cause(failures(result.failures)))
                print(f"scaletrain: {cause}; restarting all workers "
                      f"({left} restart(s) left after this one; a script with a "
                      "Checkpointer resumes from its latest checkpoint)",
                      file=sys.stderr, flush=True)
                rundir.clear_errors(run_dir)

    return agent_hooks(after_monitor if RESTARTS in adapter else None,
                       before_close if FORENSICS in adapter else None,
                       max_restarts=max_restarts if adapter.agent else None)
