"""``scaletrain plan --explain RUN``: how many GPUs are worth asking for?

``RUN`` is what a measured run left behind: a Monitor run folder (its ``summary.json``), a
``summary.json`` itself, or a ``scaling.json`` from ``scaletrain bench scaling`` (its 1-process
row). From that step, the plan's cluster profile and the scaling model
(:mod:`scaletrain.observe.scaling`) this prints, for 1..N GPUs: predicted step time,
efficiency, time to solution for the run's amount of work, and billed GPU-hours; then it
recommends the largest GPU count whose predicted efficiency stays at or above 80% and says
what limits it. Pure apart from reading ``RUN``.
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable
from typing import Any

from scaletrain.clusters.resources import billed_amount
from scaletrain.contract.files import SCALING_REPORT, SUMMARY_FILE
from scaletrain.errors import UsageError
from scaletrain.fileio import read_json
from scaletrain.observe.monitorfiles import summary_step
from scaletrain.observe.overhead import STEP_EXPONENT, Overhead, from_record, load_calibration
from scaletrain.observe.scaling import (DEFAULT_THRESHOLD, Links, StepProfile, billed_gpus, efficiency_text,
                                        links_from_profile, predict, recommend, sizes_up_to, time_to_solution)


MAX_REPORT_BYTES = 64 * 2**20


def load_measurement(path: str, *, params: float | None = None) -> tuple[StepProfile, float, str]:
    """(step, samples of work, description) from a run folder, summary.json or scaling.json."""
    p = Path(path).expanduser()
    try:
        if p.is_dir():
            for name in (SUMMARY_FILE, SCALING_REPORT):
                if (p / name).is_file():
                    p = p / name
                    break
        # a report is a small regular file: never block on a FIFO or read a device without end
        if p.exists() and not p.is_file():
            raise UsageError(f"--explain: {path} is not a regular file",
                             "give a Monitor run folder (with summary.json) or a bench scaling.json")
        if p.exists() and p.stat().st_size > MAX_REPORT_BYTES:
            raise UsageError(f"--explain: {path} is larger than a report can be "
                             f"({MAX_REPORT_BYTES // 2**20} MiB)", "give a summary.json or scaling.json")
        doc = read_json(p, limit=MAX_REPORT_BYTES)   # the bound holds if it grows meanwhile; depth too
    except FileNotFoundError:
        raise UsageError(f"--explain: {path} not found",
                         "give a Monitor run folder (with summary.json) or a bench scaling.json") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--explain: cannot read {p}: {exc}", "give a Monitor summary.json or a scaling.json") from None
    if not isinstance(doc, dict):
        raise UsageError(f"--explain: {p} is not a Monitor summary or scaling report", "give a summary.json")
    if doc.get("kind") == "scaling":
        rows = [r for r in doc.get("rows", []) if r.get("nproc") == 1]
        if not rows:
            raise UsageError(f"--explain: {p} has no 1-process row", "run bench scaling with --nproc 1,...")
        r = rows[0]
        step_s, wait_frac, grad, per_step = r["step_s"], r["data_wait_frac"], r["grad_bytes"], r["batch_per_device"]
        work = per_step * r["steps"]
        what = f"bench scaling of {r['workload']} on 1 process"
    else:
        measured = summary_step(doc)
        if measured is None:
            raise UsageError(f"--explain: {p} has no measured steps (step_s_median, samples_per_step)",
                             "run more steps than the Monitor's warm-up before explaining")
        step_s, per_step, wait_frac = measured.step_s, measured.samples_per_step, measured.data_wait_frac
        grad, work = measured.grad_bytes, measured.samples
        what = f"Monitor summary of {measured.steps} steps on {measured.world_size} process(es)"
        if measured.world_size > 1:
            what += " (its step is treated as a 1-GPU step; it includes that run's communication)"
    if not grad:
        if params is None:
            raise UsageError(f"--explain: {p} does not give the gradient size",
                             "call monitor.watch(model) in the run, or pass --params (e.g. 25.6M)")
        grad = int(params * 4)  # fp32 gradients
    wait = step_s * float(wait_frac)
    step = StepProfile(compute_s=step_s - wait, data_wait_s=wait, grad_bytes=int(grad), samples_per_step=int(per_step))
    return step, work, f"{what}, {p}"


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def explain(step: StepProfile, links: Links, *, requested: int, work_samples: float, max_gpus: int | None = None,
            time_limit_s: float | None = None, threshold: float = DEFAULT_THRESHOLD,
            cluster: str = "", source: str = "", overhead: Overhead | None = None,
            bill: Callable[[float], tuple[float, str]] | None = None) -> str:
    """The advice text: a table for 1..N GPUs, the recommendation and what limits it."""
    top = max_gpus or max(requested * 4, links.devices_per_node * 2)
    sizes = sizes_up_to(top, include=(requested,))
    ov = overhead or Overhead()
    # the billed column in the centre's unit (the profile's billing rule), GPU-hours without one
    bill = bill or (lambda device_hours: (device_hours, "GPU-h"))
    unit = bill(0.0)[1]
    preds = [predict(step, links, n, overhead=ov) for n in sizes]
    lines = [f"scaletrain plan --explain: data-parallel (DDP) scaling on {cluster}, from {source}",
             f"  measured 1-GPU step {step.compute_s * 1000 + step.data_wait_s * 1000:.1f} ms "
             f"(data wait {step.data_wait_s * 1000:.1f} ms), {step.grad_bytes / 1e6:.1f} MB of gradients, "
             f"{step.samples_per_step} samples per GPU per step",
             f"  all-reduce bandwidth: {links.intra_gbs:.0f} GB/s inside a node"
             + (f", {links.inter_gbs:.0f} GB/s between nodes" if links.inter_gbs else "")
             + " (the profile's peak rates x typical achieved fractions)",
             *_overhead_lines(ov, step, cluster),
             f"  {'GPUs':>5} {'nodes':>5} {'ms/step':>9} {'efficiency (range)':>18} {'time to solution':>17} "
             f"{'billed (' + unit + ')':>17}  limit"]
    for p in preds:
        tts = time_to_solution(p, step, samples=work_samples) if work_samples else None
        billed = bill(billed_gpus(p.n, links) * tts / 3600)[0] if tts else None
        mark = "  <- requested" if p.n == requested else ""
        lines.append(f"  {p.n:>5} {p.nodes:>5} {p.step_s * 1000:>9.1f} {efficiency_text(p):>18} "
                     f"{_hms(tts) if tts else '-':>17} {f'{billed:.1f}' if billed else '-':>17}  {p.limit}{mark}")
    best = recommend(preds, threshold=threshold)
    beyond = [p for p in preds if p.n > best.n]
    why = (f"; beyond it {beyond[0].limit} limits it ({beyond[0].n} GPUs: {efficiency_text(beyond[0])})"
           if beyond else f"; it stays above {threshold * 100:.0f}% up to the largest size shown")
    lines.append(f"  recommendation: {best.n} GPU(s) on {best.nodes} node(s), the largest count whose predicted "
                 f"efficiency stays >= {threshold * 100:.0f}% at the low end of its range{why}")
    req = next(p for p in preds if p.n == requested)
    if work_samples and time_limit_s:
        tts = time_to_solution(req, step, samples=work_samples)
        fits = "fits in" if tts <= time_limit_s else "does NOT fit in"
        lines.append(f"  requested {requested} GPU(s): {_hms(tts)} for the measured run's work, which {fits} "
                     f"the time limit {_hms(time_limit_s)}")
    lines.append("  the model leaves out start-up, evaluation and checkpoint pauses and file-system "
                 "contention: measure with 'scaletrain bench scaling' or a short run to check")
    return "\n".join(lines)


def _overhead_lines(ov: Overhead, step: StepProfile, cluster: str) -> list[str]:
    """Where the cost of running distributed comes from, and what would narrow its range."""
    lo, hi = ov.growth_range
    if ov.calibrated:
        here = ov.seconds(step.compute_s, 2)
        scaled = (f"; measured {(ov.at_two_s or 0) * 1000:.1f} ms with a {ov.at_step_s * 1000:.1f} ms step, scaled to "
                  f"this one as (step ratio)^{STEP_EXPONENT:g}" if ov.at_step_s and abs(here - (ov.at_two_s or 0)) > 1e-9
                  else "")
        return [f"  distributed overhead (sync, stragglers, launch): calibrated, {here * 1000:.1f} ms per step at 2 "
                f"GPUs ({ov.source}{scaled}), +{ov.growth * 100:.0f}% per doubling beyond "
                f"(published runs: {lo * 100:.0f}-{hi * 100:.0f}%, the range)"]
    flo, fhi = ov.fraction_range
    return [f"  distributed overhead (sync, stragglers, launch): NOT calibrated, {ov.fraction * 100:.1f}% of the 1-GPU "
            f"step at 2 GPUs (published runs: {flo * 100:.0f}-{fhi * 100:.0f}%, the range), "
            f"+{ov.growth * 100:.0f}% per doubling",
            f"    to narrow the range: 'scaletrain bench scaling --nproc 1,2 --cluster {cluster or 'NAME'}' on one "
            "node with 2 GPUs (a short run; plan --explain then finds its calibration)"]


def run_calibration(run: str, cluster: str) -> Overhead | None:
    """The overhead a bench ``scaling.json`` given as RUN measured on ``cluster``, if it is one."""
    p = Path(run).expanduser()
    p = p / SCALING_REPORT if p.is_dir() else p
    try:
        doc = read_json(p, limit=MAX_REPORT_BYTES) if p.name == SCALING_REPORT and p.is_file() else None
    except (OSError, ValueError):
        return None
    cal = doc.get("calibration") if isinstance(doc, dict) else None
    return from_record(cal) if isinstance(cal, dict) and cal.get("cluster") == cluster else None


def explain_plan(plan: Any, run: str) -> str:
    """``plan --explain RUN`` for a made plan: the overhead from RUN (a bench scaling.json on the
    plan's cluster), else the cluster's stored calibration, else the published default."""
    step, work, source = load_measurement(run, params=plan.request.params)
    links = links_from_profile(plan.profile)
    if links is None:
        raise UsageError(f"cluster profile {plan.cluster!r} has no link bandwidths (intra_node_gbps)",
                         "add intra_node_gbps and inter_node_gbps to the profile, or explain on another cluster")
    overhead = run_calibration(run, plan.profile.name) or load_calibration(plan.profile.name)
    return explain(step, links, requested=plan.gpus, work_samples=work, time_limit_s=plan.time_seconds,
                   cluster=plan.cluster, source=source, overhead=overhead,
                   bill=lambda device_hours: billed_amount(device_hours, plan.profile))
