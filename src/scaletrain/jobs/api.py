"""The Python API of a job's life after planning, for notebooks and scripts::

    import scaletrain
    job = scaletrain.submit(cluster="roihu", gpus=8, account="project_123",
                            program=["train.py", "--epochs", "10"])
    job.state            # "PENDING", "RUNNING", "COMPLETED"...
    job.wait()           # until it ends; returns the final state
    print(job.logs())    # its output, every requeued run
    job.cancel(save=True)
    job.report()         # RUN/report.html and the text summary

``scaletrain.Job(run_dir)`` reopens a job from its run folder (one a ``scaletrain submit`` made,
too). Nothing here imports torch. The CLI verbs ``status``, ``logs``, ``cancel`` and ``report``
call the same functions (:mod:`scaletrain.jobs`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from scaletrain import settings
from scaletrain.errors import SlurmError, UsageError

if TYPE_CHECKING:
    from scaletrain.jobs.cancel import CancelResult
    from scaletrain.jobs.status import RunStatus

# Job.logs()'s rank, declared in the settings vocabulary (as Job.wait()'s seconds are)
RANK = settings.Spec(doc="the rank whose lines to show (None: every rank's), e.g. rank=0",
                     check=settings.count(low=0), optional=True)


# Job()'s and report()'s paths and environment, in the settings vocabulary; a value of the wrong
# kind is the TypeError these calls always promised (and a one-line UsageError as well)
PATH = settings.Spec(doc="e.g. Job('runs/20261125-0102-train')", check=settings.path(),
                     error=settings.SettingTypeError)
ENVIRON = settings.Spec(doc="variables for Slurm's commands (None: this process's)", check=settings.str_mapping(),
                        optional=True, error=settings.SettingTypeError)


class Job:
    """A submitted job, known by its run folder (``job.sh``, ``job_id``, output files)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> None:
        from scaletrain.jobs.runfolder import open_run

        settings.check_value(PATH, run_dir, "run_dir")
        settings.check_value(ENVIRON, env, "env")
        self.run_dir = Path(run_dir).absolute()
        self.env = dict(env) if env is not None else None   # for Slurm's commands (tests: SLURM_CONF)
        run = open_run(self.run_dir)
        if run.job_id is None:
            raise UsageError(f"{run_dir} holds no submitted job ({'; '.join(run.notes) or 'no job_id file'})",
                             "give a run folder that 'scaletrain submit' or scaletrain.submit() made")
        self.job_id: str = run.job_id

    def __repr__(self) -> str:
        return f"Job({str(self.run_dir)!r}, job_id={self.job_id!r})"

    def status(self) -> RunStatus:
        """The full status line's data (:class:`scaletrain.jobs.status.RunStatus`)."""
        from scaletrain.jobs.status import collect

        return collect([self.run_dir], env=self.env)[0]

    @property
    def state(self) -> str:
        """Slurm's state now (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED...; UNKNOWN once
        Slurm has forgotten a job it keeps no accounting for). ``SlurmError`` when Slurm does
        not answer: its silence is not a state."""
        from scaletrain.jobs.status import job_state

        return job_state(self.job_id, env=self.env)

    def wait(self, timeout: float | None = None, poll: float = 5.0) -> str:
        """Block until the job ends; returns its final state (``UNKNOWN``: Slurm answered and has
        forgotten the job). ``SlurmError`` after ``timeout`` seconds (the job keeps running:
        waiting gives up, nothing is cancelled), or when Slurm stops answering: each silence is
        retried, said on stderr, and a few in a row end the wait."""
        from scaletrain.jobs.status import wait_for
        from scaletrain.slurm.poll import seconds

        poll_s = seconds("poll", poll) or 5.0
        waited = wait_for(self.job_id, timeout=timeout, poll=poll_s, max_poll=max(60.0, poll_s), env=self.env,
                          on_note=lambda text: print(f"scaletrain: job {self.job_id}: {text}",
                                                     file=sys.stderr, flush=True))
        if not waited.done:
            raise SlurmError(f"job {self.job_id} still {waited.value} after {waited.seconds:.0f} s",
                             "it keeps running; wait again or job.cancel()")
        return waited.value

    def logs(self, rank: int | None = None) -> str:
        """The job's output so far, every run of a requeued job; ``rank``: that rank's lines only."""
        from scaletrain.jobs.logs import read_lines

        rank = settings.check_value(RANK, rank, "rank")
        return "".join(read_lines(self.run_dir, rank=rank))

    def cancel(self, save: bool = False, wait_s: float = 300.0) -> CancelResult:
        """Cancel now, or (``save``) let it checkpoint and stop without requeueing, waiting up to
        ``wait_s``; returns :class:`scaletrain.jobs.cancel.CancelResult`."""
        from scaletrain.jobs.cancel import cancel

        return cancel(self.run_dir, save=save, wait_s=wait_s, env=self.env)

    def report(self, out: str | os.PathLike[str] | None = None) -> str:
        """Write the HTML report (default ``RUN/report.html``) and return the text summary."""
        from scaletrain.jobs import report, report_page

        if out is not None:
            settings.check_value(PATH, out, "out")
        rep = report.build(self.run_dir, env=self.env)
        report_page.write(rep, out)
        return report_page.render_text(rep)


def submit(*, cluster: str, program: Sequence[str], gpus: int | None = None, nodes: int | None = None,
           account: str | None = None, run_dir: str | os.PathLike[str] | None = None,
           env: Mapping[str, str] | None = None, check: bool = True, **request: Any) -> Job:
    """Plan and submit ``program`` (a script and its arguments) like ``scaletrain submit``.

    ``cluster`` is a profile name or a ``.toml`` file; ``request`` takes any other field of
    :class:`scaletrain.plan.request.JobRequest` (``time="01:00:00"``, ``requeue=True``,
    ``modules=["pytorch"]``, ``venv="/projappl/p/env"``), each of its own type (a str for
    ``modules`` or ``setup`` is one item). ``account`` defaults to ``$SBATCH_ACCOUNT``. ``env``
    adds variables to (or replaces them in) this process's environment for sbatch, and so for
    the job, which inherits it; it is not the whole environment. The job runs in the current
    folder; its script, id and output go to ``run_dir`` (default ``runs/<timestamp>-<name>/``).
    The same path as the CLI (:mod:`scaletrain.jobs.submit`): on a login node the job gets the
    environment running scaletrain, and the check before sbatch refuses a job that would stop at
    its first line: ``DistEnvError`` for a Python that lacks scaletrain or what the program imports
    whatever happens, or a set-up (``setup=`` lines included) that fails; ``UsageError`` for a
    program that cannot be read here as Python. ``check=False`` skips that check (a warning says
    what it skipped, and ``job.sh`` records it); what it could not ask here, or the program's
    optional imports the job's Python lacks, are warnings. Bad values raise ``UsageError`` naming
    the parameter. Returns the :class:`Job`.
    """
    import warnings

    from scaletrain.jobs.api_values import build_request, sbatch_environment
    from scaletrain.jobs.submit import prepare, send

    environ = sbatch_environment(env)
    req = build_request(cluster=cluster, program=program, gpus=gpus, nodes=nodes, account=account,
                        run_dir=run_dir, check=check, fields=request)
    prepared = prepare(req, run_dir=run_dir, environ=environ, check=check, flag="run_dir")
    for note in (*prepared.notes, *filter(None, [prepared.unasked])):
        warnings.warn(f"scaletrain: {note}", stacklevel=2)
    send(prepared)
    return Job(prepared.run_dir, env=environ)
