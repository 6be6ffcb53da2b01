"""``scaletrain report RUN``, shown: the text summary and the HTML page of a :class:`Report`.

The page is one self-contained HTML file with inline SVG charts (no scripts, no external files),
like the scaling report, so it opens from a login node's file share. What the figures are, and
where they come from, is :mod:`scaletrain.jobs.report`.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any, Mapping

from scaletrain.errors import UsageError, printable
from scaletrain.jobs import gpus as gpu_files
from scaletrain.jobs.report import Report, figures
from scaletrain.jobs.svg import line_chart
from scaletrain.jobs.thin import MAX_POINTS

REPORT_NAME = "report.html"
MAX_IDLE_LINES = 20     # idle GPUs named one a line; the rest counted (a job of 24,000 GPUs)


def _device_text(util: Mapping[str, Any]) -> str:
    figures = ", ".join(f"{k} {v:.3g}" for k, v in util.items()
                        if k not in {"available", "device", "samples"} and isinstance(v, (int, float)))
    return f"device {util.get('device')}: {figures}"


def render_text(rep: Report) -> str:
    """The plain-text summary, for the terminal and for a ticket."""
    f = figures(rep)
    head = f"scaletrain report: {rep.run_dir}" + (f" (job {rep.job_id}" if rep.job_id else "")
    head += (f", {f['state']}" if f["state"] else "") + (")" if rep.job_id else "")
    lines = [head, f"  runs: {f['runs']}" + (f" (restarted {f['runs'] - 1}x)" if f["runs"] > 1 else "")]
    if f["last_step"] is not None:
        lines.append(f"  steps: reached {f['last_step']}" + (f" of {f['total_steps']}" if f["total_steps"] else "")
                     + f"; {f['steps_redone']} redone after restarts")
    if f["between_runs_s"] is not None:
        lines.append(f"  lost between runs (requeue, queue, start-up): {f['between_runs_s']:.0f} s")
    if f["samples_per_s"] is not None:
        lines.append(f"  throughput: {f['samples_per_s']:.4g} samples/s" + (
            " (the runs' figures weighted by their steps: " if len(f["run_rates"]) > 1 else " (")
            + ", ".join(f"run {i} {r:.4g} over {n} steps" for i, r, n in f["run_rates"]) + ")")
    if f["billed"] is not None:
        lines.append(f"  cost: {f['billed']} over {f['elapsed_s']} s of running "
                     f"({f['cluster']} profile's billing rule on sacct's allocation)")
    elif f["gpu_hours"] is not None:
        why = ("job.sh names no cluster whose profile says which" if f["cluster"] is None
               else "no GPUs allocated: the job's CPUs are billed, not counted here")
        lines.append(f"  GPU-hours: {f['gpu_hours']:.3f} allocated over {f['elapsed_s']} s of running "
                     f"(the centre bills in its own unit; {why})")
    util = f["device_util"]
    if f["gpu_hours_busy"] is not None:
        lines.append(f"  GPU-hours busy (sampler, {f['gpus_sampled']} GPUs): {f['gpu_hours_busy']:.3f}")
        starved = gpu_files.idle(rep.gpus)
        for g in starved[:MAX_IDLE_LINES]:
            lines.append(f"  idle or starved: {g.label} at {g.mean_util() or 0:.0f}% on average. HINT: {gpu_files.HINT}")
        if len(starved) > MAX_IDLE_LINES:
            lines.append(f"  idle or starved: {len(starved) - MAX_IDLE_LINES} more GPUs (the first "
                         f"{MAX_IDLE_LINES} are named)")
    elif util and util.get("available"):
        lines.append(f"  GPU use of rank 0's {_device_text(util)} (other GPUs: the findings below)")
    else:
        why = util.get("reason") if util else "no GPU sampler in the Monitor's records"
        lines.append(f"  GPU-hours busy: unknown ({why})")
    if f["cpu_efficiency"] is not None:
        lines.append(f"  CPU efficiency (sacct): {f['cpu_efficiency'] * 100:.0f}%")
    for rec in rep.acct:
        queued = _queued(rec)
        if queued is not None:
            lines.append(f"  run submitted {rec.get('Submit')}: queued {queued} s, ran {rec.get('Elapsed')}, "
                         f"{rec.get('State')}")
    if rep.checkpoints:
        lines.append(f"  checkpoints committed: steps {', '.join(map(str, rep.checkpoints))}; "
                     + (f"a resume loads step {rep.resume_step}"
                        + (" (sizes checked here; the resume reads its checksums)" if rep.resume_unread else "")
                        if rep.resume_step is not None
                        else "none is intact: a resume stops with an error (see the notes)"))
    if rep.stop:
        lines.append(f"  stopped on purpose: {rep.stop.get('reason')} at step {rep.stop.get('step')} "
                     f"({rep.stop.get('signal')}, run {_stopped_run(rep)} of {f['runs']})"
                     + (f"; a later run went on to step {rep.stop['superseded'].get('step')} and ended normally"
                        if isinstance(rep.stop.get("superseded"), dict) else ""))
    for finding in rep.findings:
        lines.append(f"  finding: {finding.get('message', finding)}"
                     + (f" HINT: {finding['hint']}" if finding.get("hint") else ""))
    lines += [f"  note: {n}" for n in rep.notes]
    # findings, notes and Slurm's words come from outside: nothing in them may drive the terminal
    return printable("\n".join(lines), keep="\n") + "\n"


def _stopped_run(rep: Report) -> int:
    """The run (numbered from 1, as in "runs: N") whose steps reached the stop's step; else
    Slurm's restart count + 1 (the record's ``restart_count`` is 0 in a job's first run)."""
    step = rep.stop.get("step") if rep.stop else None
    for i, part in enumerate(rep.parts):
        if isinstance(step, int) and part.offset < step <= part.offset + part.count:
            return i + 1
    restarts = rep.stop.get("restart_count") if rep.stop else None
    return restarts + 1 if isinstance(restarts, int) else len(rep.parts)


def _queued(rec: Mapping[str, str]) -> int | None:
    import datetime as dt

    try:
        return int((dt.datetime.fromisoformat(rec["Start"]) - dt.datetime.fromisoformat(rec["Submit"])).total_seconds())
    except (KeyError, ValueError):
        return None


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    step = max(1, len(points) // MAX_POINTS)
    return points[::step]


def render_html(rep: Report) -> str:
    """The page: the text summary, throughput over time (every run), loss by step."""
    t0 = min((float(p.start["time"]) for p in rep.parts if isinstance(p.start.get("time"), float)), default=None)
    speed, loss = [], []
    for i, part in enumerate(rep.parts):
        base = (part.start.get("time", t0) - t0) if t0 is not None and isinstance(part.start.get("time"), float) else 0.0
        speed.append((f"run {i + 1}", [(base + t, v) for t, v in part.speed.drawn()]))
        loss.append((f"run {i + 1}", [(part.offset + n, v) for n, v in part.loss.drawn()]))
    g0 = min((g.first_t for g in rep.gpus if g.first_t is not None), default=0.0)
    drawn = [g for g in rep.gpus if g.points]   # the least busy GPUs (jobs.gpus.CHART_GPUS)
    gpu_util = [(g.label, _thin([(t - g0, u) for t, u, _ in g.points if u is not None])) for g in drawn]
    gpu_mem = [(g.label, _thin([(t - g0, m) for t, _, m in g.points if m is not None])) for g in drawn]
    charts = [line_chart("throughput (samples/s) over time since the first start (s)", speed),
              line_chart("loss by step", loss, marks=[float(c) for c in rep.checkpoints])]
    if rep.gpus:
        charts += [line_chart("GPU utilisation (%) per GPU over time (s), from the node samplers", gpu_util),
                   line_chart("GPU memory in use (GB) per GPU over time (s)", gpu_mem)]
    return ("<!doctype html><html><head><meta charset='utf-8'><title>scaletrain report</title>"
            "<style>body{font-family:sans-serif;margin:2em;max-width:980px}pre{background:#f4f4f4;padding:1em;"
            "white-space:pre-wrap}</style></head><body>"
            f"<h1>scaletrain report</h1><pre>{html.escape(render_text(rep))}</pre>"
            + "".join(charts) + "<p>Dotted lines on the loss chart: committed checkpoints.</p></body></html>\n")


def write(rep: Report, out: str | os.PathLike[str] | None = None) -> Path:
    """Write the page (default ``RUN/report.html``) whole; returns its path."""
    from scaletrain.fileio import atomic_write, write_output

    if out is not None:      # the user's path: a device or pipe is written into, never replaced
        write_output(os.fspath(out), render_html(rep), mode=0o644)
        return Path(out)
    path = rep.run_dir / REPORT_NAME
    try:
        return atomic_write(path, render_html(rep))
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}", "give a writable --output FILE") from None
