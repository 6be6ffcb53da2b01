"""The one path from a request to a job: ``scaletrain plan``, ``scaletrain submit`` and
``scaletrain.submit()`` all go through here.

``plan_job`` is the sequence every one of them runs, in this order: the cluster profile (the
request's ``--profile`` file or cluster name), what is measured on this machine (the size of the
data to stage, which sizes the node-local disk, and the program's imports, read from its file),
the account default (``$SBATCH_ACCOUNT``, as sbatch itself does), the environment running
scaletrain on a login node (``scaletrain.envs.detect``), then the plan. ``prepare`` adds what
submitting needs: the check that the job's Python imports what it needs (``scaletrain.envs.check``:
a job that would stop at its first line is refused here, not after its wait in the queue), then
the run folder and its ``job.sh``; a job the cluster cannot take fails before any folder exists.
``send`` is the one ``sbatch`` call. The CLI prints the summary in between; the library calls
one after the other. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from scaletrain.clusters.profile import ClusterProfile
    from scaletrain.plan.planner import Plan
    from scaletrain.plan.request import JobRequest


@dataclass(frozen=True, kw_only=True)
class Planned:
    """A request settled on this machine (profile, measurements, account, environment) and its plan."""

    request: JobRequest                 # as planned: what the plan was made from
    profile: ClusterProfile
    plan: Plan


def plan_job(request: JobRequest, *, environ: Mapping[str, str] | None = None) -> Planned:
    """The one sequence from a request to its plan, for ``plan``, ``submit`` and ``scaletrain.submit()``.

    The profile is loaded from the request (its ``profile_file``, else its ``cluster`` name, which
    becomes the profile's own name). What only this machine can tell is read here, once: the size
    of ``stage_data`` (its path made absolute: the job may ``cd``), the program's imports, the
    account default and, on a login node, the environment running scaletrain. ``environ`` is the
    environment sbatch will run with (default: this process's). Raises the profile's and the
    planner's errors.
    """
    from scaletrain.clusters.profile import load_profile
    from scaletrain.envs.detect import with_running_environment
    from scaletrain.envs.imports import program_imports
    from scaletrain.fileio import tree_size_gb
    from scaletrain.plan.planner import make_plan
    from scaletrain.slurm.submit import account_or_env

    env = os.environ if environ is None else environ
    profile = load_profile(request.profile_file or request.cluster)
    stage = os.path.abspath(os.path.expanduser(request.stage_data)) if request.stage_data else None
    request = dataclasses.replace(
        request, cluster=profile.name, account=account_or_env(request.account, env),
        stage_data=stage, stage_data_gb=tree_size_gb(stage) if stage else None,   # node-local disk is sized by it
        program_imports=program_imports(request.script, cwd=request.chdir))
    request = with_running_environment(request, profile, environ=env)
    return Planned(request=request, profile=profile, plan=make_plan(request, profile))


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A planned job whose run folder holds its script, ready for sbatch."""

    plan: Plan
    run_dir: Path
    script: Path
    environ: Mapping[str, str]          # what sbatch runs with (the job inherits it)
    notes: tuple[str, ...] = ()         # what could not be checked here (said, not refused)
    checked: tuple[str, ...] = ()       # what the job's Python was found to import here (the check passed)


def prepare(request: JobRequest, *, run_dir: str | os.PathLike[str] | None = None,
            environ: Mapping[str, str] | None = None, check: bool = True,
            flag: str = "--run-dir") -> Prepared:
    """Plan ``request`` (:func:`plan_job`), check the job's Python, write the run folder's ``job.sh``.

    ``environ`` is sbatch's environment (default: this process's); ``check`` False skips the
    login-node check. ``flag`` names ``run_dir`` in messages. Raises the profile's and the
    planner's errors, ``DistEnvError`` for a job whose Python lacks scaletrain or the launcher's
    package, ``UsageError`` for a run folder that cannot be made or written.
    """
    from scaletrain.envs.check import check_job_python, needed_imports
    from scaletrain.plan.planner import job_name_for, make_plan
    from scaletrain.plan.render import render_script
    from scaletrain.plan.request import in_run_dir
    from scaletrain.slurm.submit import make_run_dir, write_script

    env = os.environ if environ is None else environ
    # the job runs in the folder it is submitted from (plan leaves --chdir to the user)
    planned = plan_job(dataclasses.replace(request, chdir=request.chdir or os.getcwd()), environ=env)
    request, plan = planned.request, planned.plan   # a request the cluster cannot take failed before any folder exists
    notes: list[str] = []
    checked: tuple[str, ...] = ()
    if check:
        note = check_job_python(plan, environ=env, cwd=request.chdir)
        notes += [note] if note else []
        checked = () if note or plan.scheduler != "slurm" else needed_imports(plan)
    wanted = Path(run_dir).expanduser() if run_dir else None
    try:
        existed = wanted is not None and wanted.exists()
    except OSError:   # a name the file system refuses: make_run_dir says so
        existed = False
    folder = make_run_dir(run_dir, job_name_for(request), flag=flag)
    try:
        plan = make_plan(in_run_dir(request, folder), planned.profile)   # the same request, placed in its folder
        text = render_script(plan)
        script = write_script(folder, text)
    except BaseException:
        if not existed:   # the folder this call made for a job that cannot be planned
            try:
                folder.rmdir()
            except OSError:
                pass
        raise
    return Prepared(plan=plan, run_dir=folder, script=script, environ=env, notes=tuple(notes), checked=checked)


def send(prepared: Prepared) -> str:
    """``sbatch`` the prepared run folder; returns the job id (also written to ``job_id``)."""
    from scaletrain.slurm.submit import require_sbatch, sbatch_run_dir

    require_sbatch(f"the script is written to {prepared.script}; submit it where Slurm is (a login node), "
                   "or use 'scaletrain plan'", prepared.environ)
    return sbatch_run_dir(prepared.run_dir, env=prepared.environ)
