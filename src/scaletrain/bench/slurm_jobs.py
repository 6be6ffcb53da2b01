"""Following the jobs of ``bench scaling --nodes`` in the queue: poll, give up, cancel.

One ``SizeJob`` per size. :func:`wait_all` polls every job's state with ``scontrol show job``
(through :mod:`scaletrain.slurm.commands`), every 2 s and 20 % slower each round up to 15 s
(sites ask users not to hammer slurmctld), until all have ended or the bound has passed. A job
pending for a reason no wait resolves (over a per-job limit: :func:`never_starts`) is cancelled
at once and fails its size. :func:`cancel_unfinished` is what Ctrl-C, a hang-up and the timeout
call, so that a benchmark never leaves jobs in the queue spending the budget.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from scaletrain.errors import SlurmError

POLL_S = 2.0                # first poll interval; grows by 20 % a round up to MAX_POLL_S
MAX_POLL_S = 15.0
_STATE_RETRIES = 5          # consecutive scontrol failures tolerated for one job


@dataclass(kw_only=True)
class SizeJob:
    """One size: its folder, its job (once submitted) and what became of it."""

    nodes: int
    job_dir: Path
    world_size: int = 0
    job_id: str | None = None
    state: str = "NEW"
    log: str | None = None
    error: str | None = None        # why this size has no result (None while it may still have one)
    hint: str = ""                  # what to do about ``error``
    cancelled: bool = False         # cancelled by us: its log ends with our scancel, not with a cause
    raw: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """``2 nodes (job 123)`` for messages."""
        job = f" (job {self.job_id})" if self.job_id else ""
        return f"{self.nodes} node{'s' if self.nodes != 1 else ''}{job}"


def poll(job: SizeJob, failures: dict[str, int], log: Callable[[str], None]) -> None:
    """Update ``job`` from ``scontrol show job``; a job Slurm forgot counts as ended."""
    from scaletrain.slurm import commands

    try:
        info = commands.job_info(str(job.job_id))
    except SlurmError as exc:
        failures[job.job_id or ""] = failures.get(job.job_id or "", 0) + 1
        if failures[job.job_id or ""] >= _STATE_RETRIES:
            job.state, job.error = "UNKNOWN", f"Slurm cannot say what became of it ({exc.message})"
            job.hint = f"look for it with 'sacct -j {job.job_id}' and read its log in {job.job_dir}"
        return
    failures.pop(job.job_id or "", None)
    job.log = info.stdout or job.log
    job.raw = info.raw
    if info.state != job.state:
        where = f" on {info.node_list}" if info.state == "RUNNING" and info.node_list else ""
        log(f"scaletrain bench scaling: {job.describe()} {info.state}{where}")
        job.state = info.state
    if info.finished and info.returncode != 0:
        reason = f", {info.reason}" if info.reason and info.reason != "None" else ""
        job.error = f"job {job.job_id} {info.state} (exit code {info.returncode}{reason})"
        job.hint = f"read the job's log: {job.log or job.job_dir}"
    elif info.state == "PENDING" and never_starts(info.reason):
        # Slurm keeps such a job pending for ever; waiting out --timeout for it helps nobody
        job.error = (f"job {job.job_id} cannot start: Slurm says {info.reason} (the size is over a limit of "
                     "the partition, account or QOS); cancelled")
        job.hint = "ask for fewer --nodes, another --partition or a shorter --time"
        log(f"scaletrain bench scaling: {job.describe()}: {job.error}")
        cancel(job, log)


def never_starts(reason: str) -> bool:
    """True for the pending reasons that no amount of waiting resolves: the job is over a per-job
    limit of its partition, association or QOS, or names something Slurm refuses
    (https://slurm.schedmd.com/job_reason_codes.html). Queue reasons (Priority, Resources,
    AssocGrp*, *MaxJobs*) resolve as other jobs end and are waited for."""
    if reason in ("PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig", "BadConstraints",
                  "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed"):
        return True
    return reason.startswith(("AssocMax", "QOSMax")) and "PerJob" in reason


def ended(job: SizeJob) -> bool:
    """True when nothing more will happen to the job: never submitted, cancelled by us, final, or lost."""
    from scaletrain.slurm.parse import FINAL_STATES

    return job.job_id is None or job.cancelled or job.state in FINAL_STATES or job.state == "UNKNOWN"


def cancel(job: SizeJob, log: Callable[[str], None]) -> bool:
    """``scancel`` one job; a failure is said (with the command to do it by hand), not raised."""
    from scaletrain.slurm import commands

    try:
        commands.cancel(str(job.job_id))
    except SlurmError as exc:
        log(f"scaletrain bench scaling: could not cancel job {job.job_id}: {exc.message} "
            f"(cancel it with: scancel {job.job_id})")
        return False
    job.cancelled = True
    return True


def wait_all(jobs: list[SizeJob], *, timeout_s: float, log: Callable[[str], None],
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Poll until every submitted job has ended (True) or ``timeout_s`` has passed (False).
    The rounds run in the one wait loop (:func:`scaletrain.slurm.poll.poll_until`); a job whose
    queries fail is handled by :func:`poll` itself, so a round never raises."""
    from scaletrain.slurm.poll import poll_until

    failures: dict[str, int] = {}

    def one_round() -> bool:
        for job in jobs:
            if not ended(job):
                poll(job, failures, log)
        return all(ended(job) for job in jobs)

    return poll_until(one_round, bool, timeout=timeout_s, poll=POLL_S, max_poll=MAX_POLL_S,
                      clock=clock, sleep=sleep).done


def cancel_unfinished(jobs: list[SizeJob], *, log: Callable[[str], None]) -> list[str]:
    """``scancel`` every submitted job that has not ended; returns their ids."""
    return [str(job.job_id) for job in jobs if job.job_id and not ended(job) and cancel(job, log)]


@contextlib.contextmanager
def hangup_is_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed SSH session) stop the collector like Ctrl-C: its jobs are cancelled."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
