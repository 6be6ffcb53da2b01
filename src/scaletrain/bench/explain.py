"""``scaletrain plan --explain RUN``: how many GPUs are worth asking for?

``RUN`` is what a measured run left behind: a run folder (its Monitor's ``summary.json``, found
where ``scaletrain report`` finds the Monitor's files: in the folder or up to two levels below), a
``summary.json`` itself, or a ``scaling.json`` from ``scaletrain bench scaling`` (its 1-process row,
read by the report's own reader, :mod:`scaletrain.bench.report`). From that step, the plan's cluster
profile and the scaling model (:mod:`scaletrain.observe.scaling`) this prints, for 1..N GPUs:
predicted step time, efficiency with its range, time to solution for the run's amount of work,
and billed GPU-hours; then it recommends the largest GPU count whose predicted efficiency stays
at or above 80% at the low end of its range and says what limits it. A step measured on the CPU
is said to be one, and gets no GPU recommendation. Pure apart from reading ``RUN``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

from scaletrain.bench import report
from scaletrain.clusters.resources import billed_amount
from scaletrain.contract.files import METRICS_FILE, SCALING_REPORT, SUMMARY_FILE
from scaletrain.errors import UsageError
from scaletrain.jobs import runfolder
from scaletrain.observe.monitorfiles import summary_step
from scaletrain.observe.overhead import REFERENCE_STEP_S, STEP_EXPONENT, Overhead, from_record, load_calibration
from scaletrain.observe.scaling import (DEFAULT_THRESHOLD, UNSEEN, Links, StepProfile, billed_gpus, efficiency_text,
                                        links_from_profile, predict, recommend, sizes_up_to, time_to_solution)

GIVE = "give a run folder (with the Monitor's summary.json), a summary.json or a bench scaling.json"


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What RUN measured, for the model."""

    step: StepProfile
    work: float                            # samples of the measured run (0: unknown)
    source: str                            # what it is and where
    device: str | None = None              # where the step ran ("cpu", "cuda:0"...), None when not said
    calibration: dict[str, Any] | None = None   # a bench scaling.json's own calibration record

    @property
    def on_cpu(self) -> bool:
        return (self.device or "").split(":")[0] == "cpu"


def _find(path: str) -> Path:
    """The file RUN names: itself, or in a run folder the Monitor's summary.json (else a scaling.json)
    in the folder or below it, where ``scaletrain report`` looks for the Monitor's files."""
    p = Path(path).expanduser()
    if not runfolder.is_dir(p):
        if p.exists() and not p.is_file():   # never block on a FIFO or read a device without end
            raise UsageError(f"--explain: {path} is not a regular file or a folder", GIVE)
        return p
    folders = runfolder.walk(p, runfolder.SEARCH_DEPTH)
    for name in (SUMMARY_FILE, SCALING_REPORT):
        for folder in folders:
            if (folder / name).is_file():
                return folder / name
    metrics = next((f / METRICS_FILE for f in folders if (f / METRICS_FILE).is_file()), None)
    if metrics is not None:
        raise UsageError(f"--explain: {path} has the Monitor's {metrics.relative_to(p)} but no {SUMMARY_FILE}",
                         "the Monitor writes summary.json when the run closes (monitor.close()): "
                         "explain a run that has finished")
    raise UsageError(f"--explain: {path} holds no {SUMMARY_FILE} or {SCALING_REPORT} "
                     f"(searched {runfolder.SEARCH_DEPTH} levels down)", GIVE)


def load_measurement(path: str, *, params: float | None = None) -> Measurement:
    """The measured step of a run folder, summary.json or scaling.json (read once)."""
    try:
        p = _find(path)
        doc = report.read_document(p)
    except FileNotFoundError:
        raise UsageError(f"--explain: {path} not found", GIVE) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--explain: cannot read {path}: {exc}", GIVE) from None
    if report.is_scaling_report(doc):
        try:
            scaling = report.scaling_report(doc)
        except report.ReportError as exc:
            raise UsageError(f"--explain: {p} is not a scaling report as bench scaling writes it: {exc}",
                             "run 'scaletrain bench scaling --nproc 1,2 --out DIR' again and give DIR") from None
        row = scaling.one_process
        if row is None:
            raise UsageError(f"--explain: {p} has no 1-process row", "run bench scaling with --nproc 1,...")
        step_s, wait_frac, grad, per_step = row.step_s, row.data_wait_frac, row.grad_bytes, row.batch_per_device
        work, device, calibration = float(per_step * row.steps), row.device, scaling.calibration
        what = f"bench scaling of {row.workload} on 1 process"
    elif isinstance(doc, dict):
        measured = summary_step(doc)
        if measured is None:
            raise UsageError(f"--explain: {p} has no measured steps (step_s_median, samples_per_step)",
                             "run more steps than the Monitor's warm-up before explaining")
        step_s, per_step, wait_frac = measured.step_s, int(measured.samples_per_step), measured.data_wait_frac
        grad, work, device, calibration = measured.grad_bytes, measured.samples, measured.device, None
        what = f"Monitor summary of {measured.steps} steps on {measured.world_size} process(es)"
        if measured.world_size > 1:
            what += " (its step is treated as a 1-GPU step; it includes that run's communication)"
    else:
        raise UsageError(f"--explain: {p} is not a Monitor summary or scaling report", GIVE)
    if not grad:
        if params is None:
            raise UsageError(f"--explain: {p} does not give the gradient size",
                             "call monitor.watch(model) in the run, or pass --params (e.g. 25.6M)")
        grad = int(params * 4)  # fp32 gradients
    wait = step_s * wait_frac
    step = StepProfile(compute_s=step_s - wait, data_wait_s=wait, grad_bytes=int(grad), samples_per_step=max(1, per_step))
    return Measurement(step=step, work=work, source=f"{what}, {p}", device=device, calibration=calibration)


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def explain(step: StepProfile, links: Links, *, requested: int, work_samples: float, max_gpus: int | None = None,
            time_limit_s: float | None = None, threshold: float = DEFAULT_THRESHOLD,
            cluster: str = "", source: str = "", overhead: Overhead | None = None,
            bill: Callable[[float], tuple[float, str]] | None = None, device: str | None = None) -> str:
    """The advice text: a table for 1..N GPUs, the recommendation and what limits it. ``device``:
    where the step was measured; a CPU step is said to be one and gets no recommendation."""
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
    on_cpu = (device or "").split(":")[0] == "cpu"
    if on_cpu:
        # a GPU runs the same step many times faster, so communication and overhead weigh far more
        # there: a table from a CPU step is arithmetic, not advice
        lines.insert(2, f"  NOTE: this step was measured on the CPU ({device}); the table treats it as one GPU's "
                        f"step. A GPU runs it many times faster, so the all-reduce and the overhead weigh more "
                        f"than shown and every efficiency below is optimistic")
        lines.append(f"  recommendation: none from a CPU measurement (were one GPU's step as long as this one: "
                     f"{best.n} GPU(s)); measure one GPU on {cluster or 'the cluster'} first: a short run with the "
                     f"Monitor, or 'scaletrain bench scaling --nproc 1,2 --cluster {cluster or 'NAME'}'")
    else:
        lines.append(f"  recommendation: {best.n} GPU(s) on {best.nodes} node(s), the largest count whose predicted "
                     f"efficiency stays >= {threshold * 100:.0f}% at the low end of its range{why}")
    req = next(p for p in preds if p.n == requested)
    if work_samples and time_limit_s:
        tts = time_to_solution(req, step, samples=work_samples)
        fits = "fits in" if tts <= time_limit_s else "does NOT fit in"
        lines.append(f"  requested {requested} GPU(s): {_hms(tts)} for the measured run's work, which {fits} "
                     f"the time limit {_hms(time_limit_s)}")
    lines.append(f"  {UNSEEN}: measure with 'scaletrain bench scaling' or a short run to check")
    return "\n".join(lines)


def _overhead_lines(ov: Overhead, step: StepProfile, cluster: str) -> list[str]:
    """Where the cost of running distributed comes from, and what would narrow its range."""
    lo, hi = ov.growth_range
    per_doubling = f"+{ov.growth * 100:.0f}% per doubling beyond (published runs: {lo * 100:.0f}-{hi * 100:.0f}%)"
    if ov.calibrated:
        here = ov.seconds(step.compute_s, 2)
        scaled = (f"; measured {(ov.at_two_s or 0) * 1000:.1f} ms with a {ov.at_step_s * 1000:.1f} ms step, scaled to "
                  f"this one as (step ratio)^{STEP_EXPONENT:g}" if ov.at_step_s and abs(here - (ov.at_two_s or 0)) > 1e-9
                  else "")
        return [f"  distributed overhead (sync, stragglers, launch): calibrated, {here * 1000:.1f} ms per step at 2 "
                f"GPUs ({ov.source}{scaled}), {per_doubling}; the range adds the calibration's own spread "
                f"(+-{ov.spread * 100:.1f}% of each GPU's step)"]
    flo, fhi = ov.fraction_range
    here = ov.seconds(step.compute_s, 2)
    return [f"  distributed overhead (sync, stragglers, launch): NOT calibrated, {here * 1000:.1f} ms per step at 2 GPUs "
            f"({ov.fraction * 100:.1f}% of a {REFERENCE_STEP_S * 1000:.0f} ms step, published runs "
            f"{flo * 100:.0f}-{fhi * 100:.0f}% the range, scaled as (step)^{STEP_EXPONENT:g}; each GPU's step at N "
            f"under strong scaling), {per_doubling}",
            f"    to narrow the range: 'scaletrain bench scaling --nproc 1,2 --cluster {cluster or 'NAME'}' on one "
            "node with 2 GPUs (a short run; plan --explain then finds its calibration)"]


def explain_plan(plan: Any, run: str) -> str:
    """``plan --explain RUN`` for a made plan: the overhead from RUN (a bench scaling.json measured on
    the plan's cluster), else the cluster's stored calibration, else the published default."""
    profile, res = plan.settled.profile, plan.resources
    measured = load_measurement(run, params=plan.settled.request.params)
    links = links_from_profile(profile)
    if links is None:
        raise UsageError(f"cluster profile {profile.name!r} has no link bandwidths (intra_node_gbps)",
                         "add intra_node_gbps and inter_node_gbps to the profile, or explain on another cluster")
    cal = measured.calibration
    own = from_record(cal) if cal and cal.get("cluster") == profile.name else None
    return explain(measured.step, links, requested=res.gpus, work_samples=measured.work,
                   time_limit_s=res.time_seconds, cluster=profile.name, source=measured.source,
                   overhead=own or load_calibration(profile.name), device=measured.device,
                   bill=lambda device_hours: billed_amount(device_hours, profile))
