"""The one path from a request to a job: ``scaletrain plan``, ``scaletrain submit`` and
``scaletrain.submit()`` all go through here.

``plan_job`` is the sequence every one of them runs, in this order: the cluster profile (the
request's ``--profile`` file or cluster name), what is measured on this machine (the size of the
data to stage, which sizes the node-local disk, the program's imports, read from its file, the
account default, ``$SBATCH_ACCOUNT`` as sbatch itself does, and on a login node the environment
running scaletrain, ``scaletrain.envs.detect``), then the plan's stages, once
(``scaletrain.plan.planner.make_plan``). ``prepare`` chooses the run folder before planning, plans
the job in it, checks that the job's Python imports what it needs (``scaletrain.envs.check``: a job
that would stop at its first line is refused here, not after its wait in the queue) and writes the
folder's ``job.sh``; a job the cluster cannot take, or whose Python is refused, leaves no folder
behind. ``send`` is the one ``sbatch`` call. The CLI prints the summary in between; the library
calls one after the other. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from scaletrain.contract.files import JOB_LOG, RUNS_DIR

if TYPE_CHECKING:
    from scaletrain.clusters.model import ClusterProfile
    from scaletrain.plan.records import Plan, RunningEnv
    from scaletrain.plan.request import JobRequest


def plan_job(request: JobRequest, *, environ: Mapping[str, str] | None = None) -> Plan:
    """The one sequence from a request to its plan, for ``plan``, ``submit`` and ``scaletrain.submit()``.

    ``environ`` is the environment sbatch will run with (default: this process's). Raises the
    profile's and the planner's errors.
    """
    from scaletrain.plan.planner import make_plan

    request, profile, running = _measured(request, os.environ if environ is None else environ)
    return make_plan(request, profile, running=running)


def _measured(request: JobRequest, env: Mapping[str, str]) -> tuple[JobRequest, ClusterProfile, RunningEnv | None]:
    """The profile (the request's ``profile_file``, else its ``cluster`` name, which becomes the
    profile's own name) and what only this machine can tell, read once: the size of ``stage_data``
    (its path made absolute: the job may ``cd``), the program's imports, the account default and,
    on a login node, the environment running scaletrain."""
    from scaletrain.clusters.profile import load_profile
    from scaletrain.envs.detect import found_here
    from scaletrain.envs.imports import program_imports
    from scaletrain.fileio import tree_size_gb
    from scaletrain.slurm.submit import account_or_env

    profile = load_profile(request.profile_file or request.cluster)
    stage = os.path.abspath(os.path.expanduser(request.stage_data)) if request.stage_data else None
    request = dataclasses.replace(
        request, cluster=profile.name, account=account_or_env(request.account, env),
        stage_data=stage, stage_data_gb=tree_size_gb(stage) if stage else None,   # node-local disk is sized by it
        program_imports=program_imports(request.script, cwd=request.chdir))
    return request, profile, found_here(profile.python, environ=env)


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
    """Plan ``request`` in its run folder (the sequence of :func:`plan_job`, once), check the job's
    Python, write the run folder's ``job.sh``.

    ``environ`` is sbatch's environment (default: this process's); ``check`` False skips the
    login-node check. ``flag`` names ``run_dir`` in messages. Raises the profile's and the
    planner's errors, ``DistEnvError`` for a job whose Python lacks scaletrain or the launcher's
    package, ``UsageError`` for a run folder that cannot be made or written.
    """
    from scaletrain.envs.check import check_job_python, needed_imports
    from scaletrain.plan.planner import make_plan
    from scaletrain.plan.render import render_script
    from scaletrain.slurm.submit import make_run_dir, write_script

    env = os.environ if environ is None else environ
    # the job runs in the folder it is submitted from (plan leaves --chdir to the user)
    request, profile, running = _measured(dataclasses.replace(request, chdir=request.chdir or os.getcwd()), env)
    made = _absent(Path(run_dir).expanduser() if run_dir else Path(RUNS_DIR))
    folder = make_run_dir(run_dir, request.slurm_job_name, flag=flag)   # chosen before planning
    # placed in it: the job runs where the user is, its script's path survives any cd, the files the
    # job writes (framework configs) and its output go to the run folder
    program = request.script if request.script == "-m" else os.path.abspath(os.path.expanduser(request.script))
    request = dataclasses.replace(request, script=program, files_dir=str(folder),
                                  log=request.log or str(folder / JOB_LOG))
    try:
        plan = make_plan(request, profile, running=running)
        notes: tuple[str, ...] = ()
        checked: tuple[str, ...] = ()
        if check:
            note = check_job_python(plan, environ=env, cwd=plan.settled.request.chdir)
            notes = (note,) if note else ()
            checked = () if note or profile.scheduler != "slurm" else needed_imports(plan)
        script = write_script(folder, render_script(plan))
    except BaseException:
        # a job that cannot go leaves nothing behind: the folder this call made, and its new parents
        for path in ([] if run_dir else [folder]) + made:
            try:
                path.rmdir()
            except OSError:
                break
        raise
    return Prepared(plan=plan, run_dir=folder, script=script, environ=env, notes=notes, checked=checked)


def _absent(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, innermost first: what making it creates."""
    out: list[Path] = []
    try:
        path = path.absolute()
        while path != path.parent and not path.exists():
            out.append(path)
            path = path.parent
    except OSError:   # a name the file system refuses: make_run_dir says so
        pass
    return out


def send(prepared: Prepared) -> str:
    """``sbatch`` the prepared run folder; returns the job id (also written to ``job_id``)."""
    from scaletrain.slurm.submit import require_sbatch, sbatch_run_dir

    require_sbatch(f"the script is written to {prepared.script}; submit it where Slurm is (a login node), "
                   "or use 'scaletrain plan'", prepared.environ)
    return sbatch_run_dir(prepared.run_dir, env=prepared.environ)
