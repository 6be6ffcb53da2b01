"""``scaletrain bench scaling``: a built-in workload at several sizes, and what the model says.

Each size runs through our own launcher (``scaletrain run --nproc-per-node N -m
scaletrain.bench.scaling_worker``) one after the other, with one thread per worker so that a
size's processes do not compete through thread pools. The rows get speed-up and parallel
efficiency against the smallest size, and the scaling model's prediction from the smallest
size's step (see :mod:`scaletrain.observe.scaling`), using either a cluster profile's
bandwidths or, on this machine, the all-reduce bus bandwidth the 2-process run measured at the
gradient size.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.errors import LaunchError, UsageError
from scaletrain.fileio import read_json
from scaletrain.observe.overhead import Overhead, calibrate, from_record, to_record
from scaletrain.observe.scaling import (Links, StepProfile, exposed_communication, links_from_profile,
                                        modelled_without_overhead, predict)


@dataclass(frozen=True, kw_only=True)
class ScalingRequest:
    """What ``bench scaling`` runs."""

    workload: str = "cnn"
    nproc: tuple[int, ...] = (1, 2)
    strategy: str = "ddp"
    mode: str = "weak"
    steps: int = 20
    warmup: int = 3
    batch: int = 32
    cluster: str | None = None
    timeout_s: float = 600.0


MAX_PROCS = 1024     # local processes or nodes per size: far above any honest run, far below a fork bomb


def parse_nproc(text: str, flag: str = "--nproc") -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4), checked (``flag`` names it in errors: --nproc or --nodes)."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts or not all(re.fullmatch(r"[0-9]+", x) for x in parts):   # ASCII digits only
        raise UsageError(f"{flag} must be numbers separated by commas, got {text[:40]!r}", f"e.g. {flag} 1,2,4")
    sizes = tuple(sorted({int(x) if len(x) <= 9 else MAX_PROCS + 1 for x in parts}))
    if sizes[0] < 1:
        raise UsageError(f"{flag} sizes must be at least 1, got {text[:40]!r}", f"e.g. {flag} 1,2,4")
    if sizes[-1] > MAX_PROCS:
        raise UsageError(f"{flag} {text.strip()[:40]!r} asks for more than {MAX_PROCS}", f"e.g. {flag} 1,2,4")
    return sizes


def worker_args(req: ScalingRequest, out: Path) -> list[str]:
    """The worker's arguments after ``-m scaletrain.bench.scaling_worker`` (local runs and Slurm jobs)."""
    return ["--workload", req.workload, "--strategy", req.strategy, "--mode", req.mode,
            "--batch", str(req.batch), "--steps", str(req.steps), "--warmup", str(req.warmup),
            "--out", str(out)]


def _worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_size(req: ScalingRequest, n: int, workdir: Path) -> dict[str, Any]:
    """Launch the worker on ``n`` local processes and return its row."""
    out = workdir / f"size{n}.json"
    cmd = [sys.executable, "-m", "scaletrain", "run", "--nproc-per-node", str(n), "--ranks", "0",
           "-m", "scaletrain.bench.scaling_worker", *worker_args(req, out)]
    try:
        proc = subprocess.run(cmd, env=_worker_env(), capture_output=True, text=True, timeout=req.timeout_s)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"bench scaling: {n} process(es) did not finish within {req.timeout_s:g} s",
                          "use fewer --steps or a longer --timeout") from None
    if proc.returncode != 0 or not out.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise LaunchError(f"bench scaling: the run on {n} process(es) failed (exit {proc.returncode}):\n{tail}",
                          "run the same size with 'scaletrain run' to see the whole output")
    return read_json(out)   # the worker's one row


def local_links(rows: list[dict[str, Any]], *, background_load: float = 0.0) -> tuple[Links | None, str]:
    """Links for this machine: the measured bus bandwidth, CPU cores as compute slots."""
    measured = [r for r in rows if r["nproc"] > 1 and r.get("allreduce_busbw_gbs")]
    if not measured:
        return None, "no multi-process run measured a bandwidth"
    first = min(measured, key=lambda r: r["nproc"])
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    cpu = first["device"] == "cpu"
    threads = int(first.get("threads") or 1)
    links = Links(intra_gbs=first["allreduce_busbw_gbs"], inter_gbs=None, devices_per_node=10 ** 6,
                  latency_s=0.0, overlap=0.0 if cpu else 0.8,
                  slots=max(1, cores // threads) if cpu else None,
                  background_load=background_load if cpu else 0.0)
    source = (f"all_reduce bus bandwidth {first['allreduce_busbw_gbs']:.3f} GB/s measured at the gradient "
              f"size ({first['grad_bytes'] / 1024 ** 2:.2f} MiB) on {first['nproc']} processes"
              + (f"; {cores} CPU cores shared by the processes and {background_load:.1f} other runnable "
                 "threads (the load average before the runs); no overlap (gloo on the CPU computes "
                 "and communicates on the same cores)" if cpu else ""))
    return links, source


def analyse(rows: list[dict[str, Any]], links: Links | None, link_source: str, *,
            one_device: str = "--nproc 1,...") -> dict[str, Any]:
    """Speed-up, efficiency and the model's prediction for each row (``one_device``: the flags
    that give the 1-process run the prediction starts from, for the note when it is missing)."""
    rows = sorted(rows, key=lambda r: r["nproc"])
    base = rows[0]
    out_rows = []
    step = None
    if links is not None and base["nproc"] == 1:
        wait = base["step_s"] * base["data_wait_frac"]
        step = StepProfile(compute_s=base["step_s"] - wait, data_wait_s=wait, grad_bytes=base["grad_bytes"],
                           samples_per_step=base["batch_per_device"])
    overhead = _calibration(rows, step, links) if step is not None and links is not None else None
    base_rate = _median_rate(base)
    for r in rows:
        # one statistic for every column: throughput from the median step (the ms/step shown), so
        # speed-up and ms/step cannot disagree; the Monitor's mean-based rate is kept beside it
        rate = _median_rate(r)
        speedup = rate / base_rate
        row = dict(r, samples_per_s=rate, samples_per_s_per_device=rate / r["nproc"],
                   samples_per_s_mean=r["samples_per_s"], speedup=speedup,
                   efficiency=speedup / (r["nproc"] / base["nproc"]))
        if step is not None and links is not None:
            # weak: the per-device batch stays (share 1); strong: the global batch is split
            share = r["batch_per_device"] / base["batch_per_device"]
            p = predict(step, links, r["nproc"], share=share, overhead=overhead)
            row.update(predicted_step_s=p.step_s, predicted_efficiency=p.efficiency, predicted_limit=p.limit,
                       predicted_efficiency_low=p.efficiency_low, predicted_efficiency_high=p.efficiency_high,
                       prediction_error=(p.step_s - r["step_s"]) / r["step_s"])
        out_rows.append(row)
    model: dict[str, Any] = {"source": link_source, "from": "the 1-process step" if step else None}
    if overhead is not None:
        model["overhead"] = to_record(overhead)
    if step is None:
        model["note"] = (f"no prediction: it needs a 1-process run ({one_device}) and a bandwidth"
                         if base["nproc"] != 1 or links is None else "")
    return {"rows": out_rows, "model": model}


def _calibration(rows: list[dict[str, Any]], step: StepProfile, links: Links) -> Overhead | None:
    """The distributed overhead fitted on the smallest multi-process run on one node (2 processes
    in the usual ``--nproc 1,2``): its measured step less what the model gives without overhead.
    Without such a run: None (the published default applies)."""
    one_node = [r for r in rows if r["nproc"] > 1 and int(r.get("nodes") or 1) == 1]
    if not one_node:
        return None
    r = min(one_node, key=lambda x: x["nproc"])
    share = r["batch_per_device"] / rows[0]["batch_per_device"]
    modelled = modelled_without_overhead(step, links, r["nproc"], share=share)
    # the overhead belongs to each process's step as it was in that run (half the batch in strong mode)
    return calibrate(r["step_s"], modelled, r["nproc"], step_s=step.compute_s * share,
                     exposed_s=exposed_communication(step, links, r["nproc"], share=share),
                     source=f"bench scaling of {r['workload']} on {r['nproc']} processes, "
                            f"{r['step_s'] * 1000:.1f} ms/step measured, {modelled * 1000:.1f} ms modelled")


def calibration_record(doc: dict[str, Any], cluster: str) -> dict[str, Any] | None:
    """What ``bench scaling`` stores for ``plan --explain`` (None when the runs gave no calibration)."""
    ov = from_record(doc.get("model", {}).get("overhead"))
    if ov is None:
        return None
    return to_record(ov, cluster=cluster, date=doc.get("date"), workload=doc.get("workload"), host=doc.get("host"))


def _median_rate(row: dict[str, Any]) -> float:
    """Samples per second of all ranks from the median step time."""
    return row["batch_per_device"] * row["nproc"] / row["step_s"]


def run_scaling(req: ScalingRequest, *, log: Any = print) -> dict[str, Any]:
    """Run every size and return the report document (``scaling.json``)."""
    rows = []
    try:  # other users' load on a shared machine, before ours starts (CPU runs only)
        background = os.getloadavg()[0]
    except OSError:
        background = 0.0
    with tempfile.TemporaryDirectory(prefix="scaletrain-bench-") as tmp:
        for n in req.nproc:
            t0 = time.monotonic()
            row = run_size(req, n, Path(tmp))
            log(f"scaletrain bench scaling: {n} process(es): {row['step_s'] * 1000:.1f} ms/step, "
                f"{_median_rate(row):.1f} samples/s ({time.monotonic() - t0:.0f} s)")
            rows.append(row)
    if req.cluster:
        links, source = profile_links(req.cluster)
    else:
        links, source = local_links(rows, background_load=background)
    return build_document(req, rows, links, source, background_load=background)


def profile_links(cluster: str) -> tuple[Links | None, str]:
    """The model's links from a cluster profile (a name or a .toml file) and where they come from."""
    from scaletrain.clusters.profile import load_profile

    profile = load_profile(cluster)
    links = links_from_profile(profile)
    if links is None:
        return None, f"cluster profile {profile.name!r} gives no bandwidths"
    return links, f"cluster profile {profile.name!r} (peak rates x achieved fractions)"


def build_document(req: ScalingRequest, rows: list[dict[str, Any]], links: Links | None, source: str, *,
                   one_device: str = "--nproc 1,...", **extra: Any) -> dict[str, Any]:
    """The report document (``scaling.json``) of measured ``rows``: one path for local and Slurm runs."""
    doc = analyse(rows, links, source, one_device=one_device)
    doc.update(kind="scaling", workload=req.workload, strategy=req.strategy, mode=req.mode, steps=req.steps,
               warmup=req.warmup, batch=req.batch, host=platform.node(), **_provenance(rows), **extra)
    record = calibration_record(doc, calibration_key(req))
    if record:
        doc["calibration"] = record
    return doc


def calibration_key(req: ScalingRequest) -> str:
    """The cluster a calibration belongs to: the profile's name, or "local" for this machine."""
    if not req.cluster:
        return "local"
    from scaletrain.clusters.profile import load_profile

    return load_profile(req.cluster).name


def _provenance(rows: list[dict[str, Any]]) -> dict[str, str]:
    """When and with what the rows were measured (the workers' torch, else the installed one)."""
    from datetime import datetime, timezone
    from importlib import metadata

    from scaletrain._version import __version__

    torch_version = next((str(r["torch"]) for r in rows if r.get("torch")), "")
    if not torch_version:
        try:
            torch_version = metadata.version("torch")   # metadata only: torch is not imported here
        except metadata.PackageNotFoundError:
            torch_version = "unknown"
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "scaletrain_version": __version__, "torch_version": torch_version}
