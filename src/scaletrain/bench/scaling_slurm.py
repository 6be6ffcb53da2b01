"""``scaletrain bench scaling --nodes 1,2,4``: one Slurm job per size, all submitted at once.

Each size is planned by our own planner (``JobRequest`` -> ``plan_job`` -> ``render_script``)
as ``python -m scaletrain.bench.scaling_worker`` on N nodes with the profile's default launcher,
written into ``DIR/jobs/<timestamp>/nodes-N/`` and submitted with ``sbatch`` through
:mod:`scaletrain.slurm.commands` (the only module that runs Slurm's commands). The sizes are
independent jobs, so they queue together and the whole benchmark takes as long as its slowest
size, not the sum. The collector follows them (:mod:`scaletrain.bench.slurm_jobs`) until
all have ended or ``timeout_s`` has passed, then reads each size's result (the worker's JSON
row, on the shared file system) and builds the same report as the local path
(:func:`scaletrain.bench.scaling.build_document`).

A size that sbatch refuses, that Slurm will never start, that fails, or that is still queued
at the timeout is a *failed size*: a line with the reason, a hint and its log file, never a
traceback. Unlike ``submit --wait``, the jobs here are the benchmark's own and worth nothing
without the collector: Ctrl-C, a hang-up and the timeout cancel every job not yet ended, so
nothing is left in the queue spending the budget.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from scaletrain.bench.scaling import ScalingRequest, build_document, profile_links, worker_args
from scaletrain.bench.slurm_jobs import SizeJob, cancel_unfinished, ended, hangup_is_interrupt, wait_all
from scaletrain.contract.files import JOB_LOG
from scaletrain.errors import ScaletrainError, SlurmError, UsageError
from scaletrain.fileio import read_json, read_tail

if TYPE_CHECKING:
    from scaletrain.clusters.profile import ClusterProfile
    from scaletrain.plan.records import Plan

WORKER = "scaletrain.bench.scaling_worker"
RESULT = "result.json"
DEFAULT_TIME = "00:20:00"   # short limits start sooner (backfill); --time for longer workloads
RESULT_WAIT_S = 10.0        # a shared file system may show the result a moment after the job ends


@dataclass(frozen=True, kw_only=True)
class SlurmScaling:
    """Where and how the sizes of ``bench scaling --nodes`` run."""

    nodes: tuple[int, ...]
    cluster: str                    # a profile name or a .toml file
    out_dir: Path                   # on a shared file system: the jobs write their results here
    gpus_per_node: int | None = None
    account: str | None = None
    partition: str | None = None
    time: str | None = None
    device: str = "auto"
    timeout_s: float = 900.0
    command: tuple[str, ...] = ()


def check_slurm_profile(cluster: str) -> ClusterProfile:
    """The profile for ``--nodes``: it must describe a Slurm cluster (UsageError otherwise)."""
    from scaletrain.clusters.profile import load_profile

    profile = load_profile(cluster)
    if profile.scheduler != "slurm":
        raise UsageError(f"cluster {profile.name!r} has no Slurm: --nodes submits one job per size",
                         "on this machine use --nproc 1,2,4; for a cluster give its profile with --cluster")
    return profile


def require_sbatch() -> None:
    """``SlurmError`` (exit 4) with the way out when this machine has no sbatch."""
    from scaletrain.slurm.submit import require_sbatch as need

    need("run --nodes on the cluster's login node; on this machine use --nproc 1,2,4")


def plan_size(req: ScalingRequest, slurm: SlurmScaling, profile: ClusterProfile, nodes: int,
              job_dir: Path) -> Plan:
    """The plan of one size: the worker on ``nodes`` nodes, its output and result in ``job_dir``.

    Planned by the one sequence ``plan``/``submit`` use (``jobs.submit.plan_job``): the account
    default and, on a login node, the environment running scaletrain, which the workers need.
    """
    from scaletrain.jobs.submit import plan_job
    from scaletrain.plan.request import JobRequest

    is_file = slurm.cluster.endswith(".toml") or os.sep in slurm.cluster
    request = JobRequest(
        cluster=profile.name, script="-m", script_args=(WORKER, *worker_args(req, job_dir / RESULT)),
        nodes=nodes, gpus_per_node=slurm.gpus_per_node, account=slurm.account, partition=slurm.partition,
        time=slurm.time or DEFAULT_TIME, device=slurm.device, job_name=f"bench-scaling-{nodes}n",
        command=slurm.command, chdir=str(job_dir), log=str(job_dir / JOB_LOG),
        profile_file=str(Path(slurm.cluster).expanduser().absolute()) if is_file else None)
    return plan_job(request)


def _jobs_root(out_dir: Path) -> Path:
    """A fresh ``DIR/jobs/<timestamp>`` folder: a second run never reuses a folder whose job may run."""
    from scaletrain.fileio import fresh_dir

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        return fresh_dir(out_dir / "jobs" / stamp).absolute()
    except OSError as exc:
        raise UsageError(f"cannot create the job folders in {out_dir}: {exc.strerror or exc}",
                         "give a writable --out DIR on a file system the compute nodes share") from None


def prepare(req: ScalingRequest, slurm: SlurmScaling) -> list[tuple[SizeJob, str]]:
    """Plan and render every size before anything is written or submitted (bad input fails first)."""
    from scaletrain.plan.render import render_script

    profile = check_slurm_profile(slurm.cluster)
    # every size is planned once before any folder exists: a size the cluster cannot take
    # (partition limits, GPUs per node) stops the benchmark before anything is made
    planned = [(n, plan_size(req, slurm, profile, n, Path("/job")).resources.world_size) for n in slurm.nodes]
    require_sbatch()
    root = _jobs_root(slurm.out_dir)
    out = []
    for n, world in planned:
        job = SizeJob(nodes=n, job_dir=root / f"nodes-{n}", world_size=world)
        job.job_dir.mkdir()
        out.append((job, render_script(plan_size(req, slurm, profile, n, job.job_dir))))
    return out


def submit_all(prepared: list[tuple[SizeJob, str]], *, log: Callable[[str], None]) -> None:
    """Write each script and submit it; a refused size gets its error, the others go on.

    Each ``SizeJob`` gets its id the moment sbatch answers, so an interrupt half-way leaves
    the caller knowing every job to cancel. ``SlurmError`` only when sbatch is not there at all
    (exit 4, nothing was submitted).
    """
    from scaletrain.slurm.submit import sbatch_run_dir, write_script

    require_sbatch()
    for job, script in prepared:
        write_script(job.job_dir, script)
        try:
            job.job_id = sbatch_run_dir(job.job_dir)
        except SlurmError as exc:
            job.state, job.error = "REFUSED", f"sbatch refused it: {exc.message}"
            job.hint = "fix the request from Slurm's message: fewer --nodes, another --partition or --time"
            log(f"scaletrain bench scaling: {job.describe()}: {job.error}")
            continue
        job.state = "SUBMITTED"
        log(f"scaletrain bench scaling: {job.describe()} submitted ({job.world_size} "
            f"process{'es' if job.world_size != 1 else ''}) "
            f"from {job.job_dir}")


_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt)|scaletrain[\w ]*: error):")


def _log_tail(path: str | None) -> str:
    """The log's most telling line, shortened: the last exception or scaletrain error, else the
    last error line that is not srun's own ("task 3: Exited with exit code 1"), else the last line."""
    if not path:
        return ""
    try:
        lines = [s.strip() for s in read_tail(path).decode(errors="replace").splitlines() if s.strip()]
    except OSError:
        return ""
    ours = [ln for ln in lines if not ln.startswith(("srun:", "slurmstepd:"))]
    for picked in ([ln for ln in ours if _EXCEPTION.match(ln)], [ln for ln in ours if "error" in ln.lower()],
                   lines):
        if picked:
            return picked[-1][:200]
    return ""


def collect(job: SizeJob, *, wait_s: float | None = None) -> dict[str, Any] | None:
    """The worker's row of a completed job, or None with ``job.error`` saying why not."""
    wait_s = RESULT_WAIT_S if wait_s is None else wait_s
    if job.error is None and job.state != "COMPLETED":
        job.error = f"job {job.job_id} ended {job.state}"
    if job.error is None:
        deadline = time.monotonic() + wait_s
        while not (job.job_dir / RESULT).is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            row = read_json(job.job_dir / RESULT)
        except (OSError, ValueError) as exc:
            job.error = f"job {job.job_id} COMPLETED but left no readable {RESULT} ({exc})"
        else:
            if isinstance(row, dict) and row.get("samples_per_s"):
                return dict(row, job_id=job.job_id, log=job.log)
            job.error = f"job {job.job_id} COMPLETED but its {RESULT} has no throughput"
    job.hint = job.hint or f"read the job's log: {job.log or job.job_dir}"
    tail = "" if job.cancelled else _log_tail(job.log)
    if tail and tail not in job.error:
        job.error += f": {tail}"
    return None


def failed_row(job: SizeJob) -> dict[str, Any]:
    """A failed size for the report: what it was, why it failed, where to look."""
    return {"nodes": job.nodes, "nproc": job.world_size, "job_id": job.job_id, "state": job.state,
            "reason": job.error or "unknown", "hint": job.hint, "log": job.log, "job_dir": str(job.job_dir)}


def run_slurm_scaling(req: ScalingRequest, slurm: SlurmScaling, *,
                      log: Callable[[str], None] = print) -> dict[str, Any]:
    """Submit every size, wait (bounded), collect: the report document with ``failed`` sizes.

    Ctrl-C (or SIGTERM/SIGHUP) cancels the jobs not yet ended and raises KeyboardInterrupt.
    ``SlurmError`` when sbatch is missing or refused every size; ``ScaletrainError`` (exit 1)
    when no size produced a result.
    """
    prepared = prepare(req, slurm)
    jobs = [job for job, _ in prepared]
    try:
        with hangup_is_interrupt():
            submit_all(prepared, log=log)
            if all(job.job_id is None for job in jobs):
                why = jobs[0].error or "sbatch refused every size"
                raise SlurmError(f"bench scaling: no size was submitted ({why})",
                                 "fix the request (see Slurm's message), or check the profile with 'sinfo'")
            finished = wait_all(jobs, timeout_s=slurm.timeout_s, log=log)
    except KeyboardInterrupt:
        gone = cancel_unfinished(jobs, log=log)
        if gone:
            log(f"scaletrain bench scaling: interrupted; cancelled job{'s' if len(gone) > 1 else ''} "
                + ", ".join(gone))
        raise
    if not finished:
        late = [job for job in jobs if not ended(job)]
        cancel_unfinished(jobs, log=log)
        for job in late:
            reason = job.raw.get("Reason", "")
            job.error = (f"job {job.job_id} still {job.state}"
                         + (f" ({reason})" if reason and reason != "None" else "")
                         + f" after {slurm.timeout_s:g} s; cancelled")
            job.hint = ("it waited in the queue: give a longer --timeout (queue time counts), or a partition "
                        "that starts sooner" if job.state == "PENDING" else
                        f"fewer --steps, or a longer --timeout (log: {job.log or job.job_dir})")
            log(f"scaletrain bench scaling: {job.nodes} node{'s' if job.nodes != 1 else ''}: {job.error}")
    rows: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for job in jobs:
        row = collect(job)
        if row is None:
            failed.append(failed_row(job))
        else:
            rows.append(row)
    if not rows:
        first = failed[0]
        raise ScaletrainError(f"bench scaling: no size finished; {first['nodes']} node(s): {first['reason']}",
                              first["hint"])
    links, source = profile_links(slurm.cluster)
    one = "--nodes 1,... --gpus-per-node 1"
    return build_document(req, rows, links, source, one_device=one, launch="slurm", cluster=slurm.cluster,
                          failed=failed, jobs_dir=str(jobs[0].job_dir.parent),
                          jobs=[{"nodes": j.nodes, "nproc": j.world_size, "job_id": j.job_id, "state": j.state,
                                 "log": j.log, "job_dir": str(j.job_dir)} for j in jobs])
