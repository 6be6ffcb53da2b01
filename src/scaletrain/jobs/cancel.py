"""``scaletrain cancel RUN [--save]``: stop a job now, or let it save and stop without requeueing.

``--save`` sends ``contract.environ.SAVE_AND_STOP_SIGNAL`` (USR2). A script from ``plan --requeue``
traps it in the batch shell, relays it to the tasks and remembers not to requeue; other
scripts have no trap, so the signal goes to the job's steps (the tasks) directly, and nothing
requeues them anyway. ``scaletrain.init()`` made USR2 a stop request with reason
``requested``: every rank stops at the same step, the Checkpointer saves it, writes
``stop.json`` and the tasks exit 75. Then this waits, bounded, for the job to end and says
which step was saved. A job still pending has nothing to save: it is cancelled outright.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from scaletrain.contract.environ import SAVE_AND_STOP_SIGNAL
from scaletrain.contract.files import STOP_RECORD
from scaletrain.contract.script import SAVE_AND_STOP_TRAP
from scaletrain.errors import SlurmError, UsageError
from scaletrain.jobs import runfolder, status
from scaletrain.jobs.runfolder import RunFolder
from scaletrain import settings
from scaletrain.slurm.poll import Waited

SAVE_WAIT_S = 300.0
# cancel()'s wait, declared in the settings vocabulary (as the waits of scaletrain.slurm.poll are)
WAIT_S = settings.Spec(doc="how long to wait for the job to save and stop, e.g. wait_s=300",
                       check=settings.number(low=0), unit="seconds")
SAVE = settings.Spec(doc="save=True lets the job checkpoint and stop; save=False cancels it now",
                     check=settings.boolean())
CANCEL_WAIT_S = 30.0      # after a plain scancel: the state it settles in
POLL_S = 2.0


@dataclass(frozen=True, kw_only=True)
class CancelResult:
    """What ``cancel`` did and saw."""

    job_id: str
    action: str                     # "cancelled", "asked to save and stop", "already ended"
    state: str                      # Slurm's state when we stopped waiting
    saved_step: int | None = None   # latest committed checkpoint afterwards
    stop: dict[str, Any] | None = None

    def message(self) -> str:
        """One line for the terminal."""
        text = f"job {self.job_id} {self.action}; now {self.state}"
        if self.stop:
            text += f"; saved step {self.stop.get('step')} ({STOP_RECORD}: {self.stop.get('reason')})"
        elif self.saved_step is not None:
            text += f"; latest checkpoint step {self.saved_step}"
        return text


def _job(run_dir: str | Path) -> RunFolder:
    run = runfolder.open_run(run_dir)
    if run.job_id is None:
        why = "; ".join(run.notes) or "no job_id file (not submitted?)"
        raise UsageError(f"{run_dir}: no job to cancel ({why})", "give a run folder from 'scaletrain status'")
    return run


def _state(job_id: str, env: Mapping[str, str] | None) -> str:
    rows = status.collect_states([job_id], env=env)
    return rows.get(job_id, "UNKNOWN")


def cancel(run_dir: str | Path, *, save: bool = False, wait_s: float = SAVE_WAIT_S,
           env: Mapping[str, str] | None = None, log: Callable[[str], None] | None = None) -> CancelResult:
    """Cancel the run's job; with ``save``, ask it to checkpoint and stop, and wait for it."""
    from scaletrain.slurm import commands

    wait_s = settings.check_value(WAIT_S, wait_s, "wait_s")
    save = settings.check_value(SAVE, save, "save")
    run = _job(run_dir)
    job_id = str(run.job_id)
    state = _state(job_id, env)
    if state in status.FINAL_STATES:
        return CancelResult(job_id=job_id, action="had already ended", state=state,
                            saved_step=runfolder.latest_checkpoint(run.checkpoints),
                            stop=runfolder.stop_record(run.checkpoints))
    if not save or state == "PENDING":
        commands.cancel(job_id, env=env)
        action = "cancelled" + (" (it had not started: nothing to save)" if save else "")
        return CancelResult(job_id=job_id, action=action, state=_settle(job_id, env, CANCEL_WAIT_S, log).value)
    trapped = run.script is not None and has_save_trap(_read(run.script))
    commands.send_signal(job_id, SAVE_AND_STOP_SIGNAL, batch=trapped, env=env)
    if log is not None:
        log(f"scaletrain: asked job {job_id} to save and stop ({SAVE_AND_STOP_SIGNAL}); "
            f"waiting up to {wait_s:.0f} s")
    waited = _settle(job_id, env, wait_s, log)
    final = waited.value
    if final not in status.FINAL_STATES:
        still = "forgotten by Slurm" if final == "UNKNOWN" else f"still {final}"
        raise SlurmError(f"job {job_id} was asked to save and stop but is {still} after {waited.seconds:.0f} s",
                         f"its program may not use scaletrain.init() and a Checkpointer; "
                         f"end it now with 'scaletrain cancel {run_dir}'")
    run = runfolder.open_run(run_dir)      # the checkpoint folder may be new since
    return CancelResult(job_id=job_id, action="saved and stopped", state=final,
                        saved_step=runfolder.latest_checkpoint(run.checkpoints),
                        stop=runfolder.stop_record(run.checkpoints))


def has_save_trap(script: str) -> bool:
    """True for a batch script whose shell traps the save-and-stop signal (``plan --requeue``):
    the signal then goes to the batch shell, which relays it and does not requeue."""
    return SAVE_AND_STOP_TRAP in script


def _read(path: Path) -> str:
    from scaletrain.fileio import read_bounded

    try:
        return read_bounded(path).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _settle(job_id: str, env: Mapping[str, str] | None, wait_s: float,
            log: Callable[[str], None] | None) -> Waited[str]:
    """Wait (the one wait loop: squeue, then sacct) until the job has ended or ``wait_s`` has
    passed; Slurm not answering is retried and said through ``log``, not taken for an end."""
    return status.wait_for(job_id, timeout=wait_s, poll=POLL_S, max_poll=POLL_S, env=env,
                           on_note=None if log is None else (lambda text: log(f"scaletrain: {text}")))
