"""The one path from a request to a job: ``scaletrain plan``, ``scaletrain submit`` and
``scaletrain.submit()`` all go through here.

``plan_job`` is the sequence every one of them runs, in this order: the cluster profile (the
request's ``--profile`` file or cluster name), what is measured on this machine (the size of the
data to stage, which sizes the node-local disk, the program's imports, read from its file, the
account default, ``$SBATCH_ACCOUNT`` as sbatch itself does, and on a login node the environment
running scaletrain, ``scaletrain.envs.detect``), then the plan's stages, once
(``scaletrain.plan.planner.make_plan``). ``prepare`` chooses the run folder before planning, plans
the job in it, runs the check before sbatch (``scaletrain.envs.check``: a job that would stop at
its first line is refused here, not after its wait in the queue) unless told not to, and writes
the folder's ``job.sh`` with the check's outcome in its header (one comment line); a job the
cluster cannot take, or whose check refuses it, leaves no folder behind, except for a dry run,
which keeps the folder and hands the refusal back. ``send`` is the one ``sbatch`` call. The CLI
prints the summary in between; the library calls one after the other. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from scaletrain.contract.files import JOB_LOG, RUNS_DIR
from scaletrain.errors import ScaletrainError, printable

if TYPE_CHECKING:
    from scaletrain.clusters.model import ClusterProfile
    from scaletrain.envs.check import CheckResult
    from scaletrain.envs.imports import ProgramImports
    from scaletrain.plan.records import Plan, RunningEnv
    from scaletrain.plan.request import JobRequest


def plan_job(request: JobRequest, *, environ: Mapping[str, str] | None = None) -> Plan:
    """The one sequence from a request to its plan, for ``plan``, ``submit`` and ``scaletrain.submit()``.

    ``environ`` is the environment sbatch will run with (default: this process's). Raises the
    profile's and the planner's errors.
    """
    from scaletrain.plan.planner import make_plan

    request, profile, running, _ = _measured(request, os.environ if environ is None else environ)
    return make_plan(request, profile, running=running)


def _measured(request: JobRequest, env: Mapping[str, str]) -> tuple[JobRequest, ClusterProfile, RunningEnv | None,
                                                                    ProgramImports]:
    """The profile (the request's ``profile_file``, else its ``cluster`` name, which becomes the
    profile's own name) and what only this machine can tell, read once: the size of ``stage_data``
    (its path made absolute: the job may ``cd``), the program's imports (the request keeps those it
    needs whatever happens; all of them, read, are returned for the check), the account default
    and, on a login node, the environment running scaletrain."""
    from scaletrain.clusters.profile import load_profile
    from scaletrain.envs.detect import found_here
    from scaletrain.envs.imports import program_imports
    from scaletrain.fileio import tree_size_gb
    from scaletrain.slurm.submit import account_or_env

    profile = load_profile(request.profile_file or request.cluster)
    stage = os.path.abspath(os.path.expanduser(request.stage_data)) if request.stage_data else None
    program = program_imports(request.script, request.script_args, cwd=request.chdir)
    request = dataclasses.replace(
        request, cluster=profile.name, account=account_or_env(request.account, env),
        stage_data=stage, stage_data_gb=tree_size_gb(stage) if stage else None,   # node-local disk is sized by it
        program_imports=None if program.unread else program.for_plan)
    return request, profile, found_here(profile.python, environ=env), program


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A planned job whose run folder holds its script, ready for sbatch (unless ``refused``)."""

    plan: Plan
    run_dir: Path
    script: Path
    environ: Mapping[str, str]          # what sbatch runs with (the job inherits it)
    check: CheckResult | None           # what the check before sbatch found; None: skipped on request
    skipped: str | None = None          # what skipping it left unasked (``check=False``)
    refused: ScaletrainError | None = None   # a dry run's refusal by the check (never sent)

    @property
    def outcome(self) -> str:
        """The check's outcome in one line, as ``job.sh`` records it and a dry run prints it."""
        return _outcome(self.check, self.skipped, self.refused)

    @property
    def notes(self) -> tuple[str, ...]:
        """The check's notes (never a refusal): optional imports the job's Python lacks, what was not read."""
        return self.check.notes if self.check else ()

    @property
    def unasked(self) -> str | None:
        """The outcome when the job's Python was not asked (skipped on request, or not checked here)."""
        return self.outcome if self.skipped or (self.check and self.check.not_checked) else None


def _outcome(check: CheckResult | None, skipped: str | None, refused: ScaletrainError | None) -> str:
    if refused is not None:
        return f"would fail: {refused.message}"
    return skipped or (check.line if check else "")


def prepare(request: JobRequest, *, run_dir: str | os.PathLike[str] | None = None,
            environ: Mapping[str, str] | None = None, check: bool = True, dry_run: bool = False,
            flag: str = "--run-dir") -> Prepared:
    """Plan ``request`` in its run folder (the sequence of :func:`plan_job`, once), run the check
    before sbatch, write the run folder's ``job.sh``.

    ``environ`` is sbatch's environment (default: this process's); ``check`` False skips the
    check (``Prepared.skipped`` says what that leaves unasked); ``dry_run`` keeps the folder and
    its script when the check refuses the job (``Prepared.refused``) instead of raising. ``flag``
    names ``run_dir`` in messages. Raises the profile's and the planner's errors, the check's
    refusals (``DistEnvError`` for a job whose Python lacks what it needs or whose set-up fails,
    ``UsageError`` for a program that cannot be read here), ``UsageError`` for a run folder that
    cannot be made or written.
    """
    from scaletrain.envs.check import check_job_python, skipped
    from scaletrain.plan.planner import make_plan
    from scaletrain.plan.render import render_script
    from scaletrain.slurm.submit import make_run_dir, write_script

    env = os.environ if environ is None else environ
    # the job runs in the folder it is submitted from (plan leaves --chdir to the user), and its
    # script's path, made absolute here, survives any cd: the check reads the file the job runs
    script = request.script if request.script == "-m" else os.path.abspath(os.path.expanduser(request.script))
    request, profile, running, program = _measured(
        dataclasses.replace(request, script=script, chdir=request.chdir or os.getcwd()), env)
    made = _absent(Path(run_dir).expanduser() if run_dir else Path(RUNS_DIR))
    folder = make_run_dir(run_dir, request.slurm_job_name, flag=flag)   # chosen before planning
    # placed in it: the files the job writes (framework configs) and its output go to the run folder
    request = dataclasses.replace(request, files_dir=str(folder), log=request.log or str(folder / JOB_LOG))
    try:
        plan = make_plan(request, profile, running=running)
        result: CheckResult | None = None
        refused: ScaletrainError | None = None
        if check:
            try:
                result = check_job_python(plan, program=program, environ=env, cwd=plan.settled.request.chdir)
            except ScaletrainError as exc:
                if not dry_run:
                    raise
                refused = exc
        skip = None if check else skipped(plan)
        path = write_script(folder, _recorded(render_script(plan), _outcome(result, skip, refused)))
    except BaseException:
        # a job that cannot go leaves nothing behind: the folder this call made, and its new parents
        for path in ([] if run_dir else [folder]) + made:
            try:
                path.rmdir()
            except OSError:
                break
        raise
    return Prepared(plan=plan, run_dir=folder, script=path, environ=env, check=result, skipped=skip, refused=refused)


def _recorded(script: str, outcome: str) -> str:
    """``script`` with the check's outcome as one comment line after its header's comments (before
    the ``#SBATCH`` lines, where sbatch reads on): what was asked before this job was queued."""
    lines = script.split("\n")
    at = 1
    while at < len(lines) and lines[at].startswith("# "):
        at += 1
    lines.insert(at, f"# check before sbatch: {printable(outcome)}")
    return "\n".join(lines)


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
