"""``scaletrain report RUN``: what a job did with what it was billed for - the figures.

The figures come from the run folder only: the Monitor's ``metrics.jsonl`` (a ``start`` line per
run, the step lines, a ``summary`` line when a run closed cleanly, the findings), the
Checkpointer's folder (committed steps, ``stop.json``) and, when Slurm keeps accounting, one
``sacct`` call (queue time per run, elapsed, GPUs and CPUs allocated, CPU time used).
:func:`build` reads them into a :class:`Report`, :func:`figures` computes what is shown;
:mod:`scaletrain.jobs.report_page` writes the text and the HTML page.

What the job was billed is said in the centre's unit (bundles, GPU BU, GPU-hours: the profile's
billing rule applied to sacct's allocation) where the job script names its cluster (scaletrain's
header); elsewhere the report gives the GPU-hours allocated and says that the unit is unknown.

Without the Monitor the report still has Slurm's side (GPU-hours, queue time, requeues,
CPU efficiency) but cannot know throughput, the step reached, per-GPU utilisation or memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

from scaletrain.checkpoint import layout
from scaletrain.contract.files import COMMIT_MARKER, STEP_DIR_PREFIX
from scaletrain.contract.script import generated_for
from scaletrain.errors import ProfileError, SlurmError, UsageError
from scaletrain.fileio import open_regular
from scaletrain.jobs import gpus as gpu_files
from scaletrain.jobs import runfolder
from scaletrain.jobs.thin import Thinned
from scaletrain.observe import monitorfiles
from scaletrain.slurm.parse import is_count, parse_duration_seconds, parse_mem_mib

if TYPE_CHECKING:
    from scaletrain.clusters.profile import ClusterProfile

MAX_RUNS = 1000         # runs (start lines) kept; a real job is requeued a few dozen times at most
MAX_FINDINGS = 200      # findings listed; the rest are counted in a note


@dataclass(kw_only=True)
class RunPart:
    """One run of the job (a requeue starts another) as the Monitor recorded it.

    Its step records are not kept (a long run has millions): their count, the last one and the
    chart lines, thinned to a bound as they stream past.
    """

    start: dict[str, Any]
    steps: int = 0                                  # step records read
    last: dict[str, Any] | None = None              # the last step record
    speed: Thinned[tuple[float, float]] = field(default_factory=Thinned)   # (t, samples/s)
    loss: Thinned[tuple[float, float]] = field(default_factory=Thinned)    # (step, loss)
    summary: dict[str, Any] | None = None

    def add_step(self, rec: dict[str, Any]) -> None:
        """Take one ``step`` record into the count, the last step and the chart lines."""
        self.steps += 1
        self.last = rec
        if isinstance(rec.get("samples_per_s"), (int, float)):
            self.speed.add((rec["t"], rec["samples_per_s"]))
        if isinstance(rec.get("loss"), (int, float)):
            self.loss.add((rec["step"], rec["loss"]))

    @property
    def offset(self) -> int:
        """The step this run resumed from."""
        value = self.start.get("start_step", 0)
        return value if isinstance(value, int) else 0

    @property
    def count(self) -> int:
        """Steps this run trained: its summary's count, else its last step line's number."""
        counted = self.summary.get("steps") if self.summary else None
        if isinstance(counted, int) and not isinstance(counted, bool):
            return counted
        return int(self.last["step"]) if self.last else 0


@dataclass(kw_only=True)
class Report:
    """Everything the text and the page show."""

    run_dir: Path
    job_id: str | None
    parts: list[RunPart]
    findings: list[dict[str, Any]]
    checkpoints: list[int]
    stop: dict[str, Any] | None
    resume_step: int | None = None      # what a resume loads (the one rule, checkpoint.layout.choose)
    resume_unread: bool = False         # chosen by its sizes: its checksums are read by the resume only
    acct: list[dict[str, str]]
    notes: list[str]
    gpus: list[gpu_files.GpuSeries] = field(default_factory=list)
    profile: ClusterProfile | None = None   # the cluster job.sh was planned for (its billing unit)

    @property
    def last_step(self) -> int | None:
        """The program's last recorded step (resume point + the last run's count)."""
        for part in reversed(self.parts):
            if part.last:
                return part.offset + int(part.last["step"])
        return None

    @property
    def total_steps(self) -> int | None:
        """Steps the program said it would run (Monitor total_steps)."""
        for part in reversed(self.parts):
            if isinstance(part.start.get("total_steps"), int):
                return int(part.start["total_steps"])
        return None


def split_runs(records: Iterable[dict[str, Any]]) -> tuple[list[RunPart], list[dict[str, Any]], list[str]]:
    """The records of metrics.jsonl, streamed, as runs (one per ``start`` line), the findings and
    notes on what was left out: memory stays bounded whatever the file's size (the step
    records are counted and thinned, at most MAX_RUNS runs and MAX_FINDINGS findings kept)."""
    parts: list[RunPart] = []
    findings: list[dict[str, Any]] = []
    dropped_runs = dropped_findings = 0
    for rec in records:
        kind = rec.get("type")
        if kind == "start" or (not parts and kind == "step"):
            parts.append(RunPart(start=rec if kind == "start" else {}))
            if len(parts) > MAX_RUNS:           # the latest runs are the ones a user asks about
                del parts[0]
                dropped_runs += 1
        if kind == "step":
            parts[-1].add_step(rec)
        elif kind == "summary" and parts:
            parts[-1].summary = rec
        elif kind == "event":
            if len(findings) < MAX_FINDINGS:
                findings.append(rec)
            else:
                dropped_findings += 1
    notes = []
    if dropped_runs:
        notes.append(f"metrics.jsonl has {dropped_runs + MAX_RUNS} runs: the first {dropped_runs} "
                     f"are left out of the figures (the last {MAX_RUNS} are shown)")
    if dropped_findings:
        notes.append(f"{dropped_findings} more findings not listed (the first {MAX_FINDINGS} are)")
    return parts, findings, notes


def _read_runs(path: Path) -> tuple[list[RunPart], list[dict[str, Any]], list[str]]:
    """:func:`split_runs` of the metrics file; an error of the disk is a note naming it (the
    figures then cover the records before it), never "runs: 0" as if nothing was recorded."""
    failed: list[OSError] = []

    def records() -> Iterator[dict[str, Any]]:
        try:
            yield from monitorfiles.read_records(path)
        except OSError as exc:
            failed.append(exc)

    parts, findings, notes = split_runs(records())
    if failed:
        what = ("the figures cover the records before the error" if parts or findings else
                "throughput, steps, GPU use and memory are unknown")
        notes.append(f"cannot read {path}: {failed[0].strerror or failed[0]}; {what}")
    return parts, findings, notes


def build(run_dir: str | Path, *, env: Mapping[str, str] | None = None, use_sacct: bool = True) -> Report:
    """Read the run folder (and sacct once) into a :class:`Report`; ``UsageError`` when it has nothing."""
    run = runfolder.open_run(run_dir)
    if not runfolder.is_dir(run.path):
        raise UsageError(f"no run folder {run_dir}", "give a folder from 'scaletrain status' or a Monitor folder")
    notes = list(run.notes)
    parts, findings, read_notes = _read_runs(run.metrics) if run.metrics else ([], [], [])
    notes += read_notes
    if run.metrics is None:
        notes.append("no Monitor records (metrics.jsonl): throughput, steps, GPU use and memory are unknown")
    acct: list[dict[str, str]] = []
    if run.job_id and use_sacct:
        from scaletrain.slurm import commands

        try:
            acct = commands.sacct_jobs([run.job_id], env=env).get(run.job_id, [])
        except SlurmError as exc:
            notes.append(f"no Slurm accounting ({exc.message}): billed hours, queue time and CPU use unknown")
    if run.job_id is None and run.metrics is None:
        raise UsageError(f"{run_dir} holds neither a job nor Monitor records",
                         "give a run folder from 'scaletrain submit' or the folder a Monitor wrote")
    series, sampler_notes = gpu_files.read_samplers(gpu_files.sampler_files(run.path))
    profile = _profile(run.script, notes)
    choice = runfolder.checkpoint_choice(run.checkpoints)
    return Report(run_dir=run.path, job_id=run.job_id, parts=parts, findings=findings,
                  checkpoints=_committed(run.checkpoints), stop=runfolder.stop_record(run.checkpoints),
                  resume_step=choice.step, resume_unread=choice.unread, acct=acct, notes=notes + choice.notes() + sampler_notes,
                  gpus=series, profile=profile)


def _profile(script: Path | None, notes: list[str]) -> ClusterProfile | None:
    """The profile of the cluster named in ``script``'s scaletrain header, or None (with a note when
    the header names one that no profile here describes)."""
    if script is None:
        return None
    try:
        with open_regular(script) as fh:   # the header's first lines; a FIFO must not block
            head = fh.read(4096).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    name = generated_for(head)
    if name is None:
        return None
    from scaletrain.clusters.profile import load_profile

    try:
        return load_profile(name)
    except ProfileError:
        notes.append(f"job.sh was planned for cluster {name!r}, which no profile here describes: "
                     "billing in GPU-hours, not the centre's unit")
        return None


def _committed(folder: Path | None) -> list[int]:
    """Every committed step, by the checkpoint layout's own rule (:func:`layout.committed`)."""
    if folder is None:
        return []
    try:
        return [item.step for item in layout.committed(folder)]
    except (OSError, ValueError):
        return []


def _tres(text: str) -> dict[str, str]:
    """An AllocTRES value (``cpu=4,gres/gpu=2,mem=8G,node=1``) as a dict."""
    return dict(item.partition("=")[::2] for item in text.split(",") if "=" in item)


def _gpus(tres: str) -> int:
    """GPUs in an AllocTRES value."""
    value = _tres(tres).get("gres/gpu", "")
    return int(value) if is_count(value) else 0


def _billing(rep: Report) -> str | None:
    """What the runs were billed, in the centre's unit: the profile's billing rule applied to each
    run's allocation (sacct's AllocTRES and Elapsed); None without accounting, GPUs or a known cluster."""
    if rep.profile is None or not any(_gpus(row.get("AllocTRES", "")) for row in rep.acct):
        return None
    from scaletrain.clusters.resources import Resources, billed_gpu_hours, billing_text

    billed = used = 0.0
    for row in rep.acct:
        tres, seconds = _tres(row.get("AllocTRES", "")), parse_duration_seconds(row.get("Elapsed")) or 0
        nodes = int(tres["node"]) if is_count(tres.get("node", "")) and int(tres["node"]) else 1
        cpus, mem = tres.get("cpu", ""), parse_mem_mib(tres.get("mem"))
        res = Resources(nodes=nodes, gpus_per_node=_gpus(row.get("AllocTRES", "")) // nodes, tasks_per_node=1,
                        cpus_per_task=int(cpus) // nodes if is_count(cpus) else 0,
                        mem_gb=mem / 1024 / nodes if mem else None, seconds=seconds)
        billed += billed_gpu_hours(res, rep.profile)
        used += res.gpus * seconds / 3600 / max(1, rep.profile.gpus_per_billing_unit)
    return billing_text(round(billed, 2), round(used, 2), rep.profile)


def figures(rep: Report) -> dict[str, Any]:
    """The numbers of the summary, as a dict (tests compare them with the Monitor's records)."""
    out: dict[str, Any] = {"runs": max(len(rep.parts), len(rep.acct)), "last_step": rep.last_step,
                           "total_steps": rep.total_steps, "checkpoints": rep.checkpoints,
                           "resume_step": rep.resume_step}
    # each run's rate weighted by its steps: two short stopped runs must not outvote the long one
    out["run_rates"] = [(i + 1, float(p.summary["samples_per_s"]), p.count) for i, p in enumerate(rep.parts)
                        if p.summary and isinstance(p.summary.get("samples_per_s"), (int, float))]
    weight = sum(n for _, _, n in out["run_rates"])
    out["samples_per_s"] = (sum(r * n for _, r, n in out["run_rates"]) / weight if weight
                            else (out["run_rates"][-1][1] if out["run_rates"] else None))
    out["steps_recorded"] = sum(p.steps for p in rep.parts)
    redone = [prev.offset + int(prev.last["step"]) - cur.offset
              for prev, cur in zip(rep.parts, rep.parts[1:]) if prev.last]
    out["steps_redone"] = sum(max(0, r) for r in redone)
    out["between_runs_s"] = _between_runs(rep.parts)
    elapsed = [parse_duration_seconds(r.get("Elapsed")) or 0 for r in rep.acct]
    gpus = max([_gpus(r.get("AllocTRES", "")) for r in rep.acct] or [0])
    cpus = max([int(r["AllocCPUS"]) for r in rep.acct if is_count(r.get("AllocCPUS", ""))] or [0])
    cpu_used = sum(parse_duration_seconds(r.get("TotalCPU")) or 0 for r in rep.acct)
    out["elapsed_s"] = sum(elapsed) if rep.acct else None
    out["gpu_hours"] = gpus * sum(elapsed) / 3600 if rep.acct else None     # allocated: GPUs x elapsed
    out["billed"] = _billing(rep)
    out["cluster"] = rep.profile.name if rep.profile else None
    out["cpu_efficiency"] = cpu_used / (cpus * sum(elapsed)) if cpus and sum(elapsed) else None
    out["state"] = rep.acct[-1].get("State", "").split(" ")[0] if rep.acct else None
    out["gpu_hours_busy"] = sum(g.busy_hours() for g in rep.gpus) if rep.gpus else None
    out["gpus_sampled"] = len(rep.gpus)
    out["idle_gpus"] = [g.label for g in gpu_files.idle(rep.gpus)]
    util = [d for p in rep.parts if p.summary for d in [p.summary.get("device_util")] if isinstance(d, dict)]
    out["device_util"] = util[-1] if util else None
    return out


def _between_runs(parts: list[RunPart]) -> float | None:
    """Seconds from each run's last recorded step to the next run's start: the requeue, the
    wait in the queue and the next start-up, as the Monitor saw them (None with fewer than 2 runs)."""
    gaps = []
    for prev, cur in zip(parts, parts[1:]):
        began, then = prev.start.get("time"), cur.start.get("time")
        if isinstance(began, (int, float)) and isinstance(then, (int, float)) and prev.last:
            gaps.append(max(0.0, float(then) - (float(began) + float(prev.last.get("t", 0.0)))))
    return sum(gaps) if gaps else None
