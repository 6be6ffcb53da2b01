"""Every curve of docs/scale.md: each control-plane step of scaletrain at N simulated ranks.

    PYTHONPATH=src python3 benchmarks/scale_all.py            # small N: minutes on two cores
    PYTHONPATH=src python3 benchmarks/scale_all.py --full --old-src /tmp/old/src   # the page's sizes
    PYTHONPATH=src python3 benchmarks/scale_all.py --plots-only

Runs the harnesses (``scale_startup``, ``scale_steps``, ``scale_checkpoint``, ``scale_after``,
``scale_script``; each also runs alone), keeps their rows in ``docs/img/scale.json``, draws one
plot per step into ``docs/img/scale-*.png`` (matplotlib, the ``report`` extra) and prints, per
curve, the fitted growth exponent and the value projected at JUPITER's size (24,000 ranks,
6,000 nodes) with the budget it is held to. ``--old-src`` measures the scaletrain of another
source tree (39e04f3) beside this one where the step changed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_after  # noqa: E402
import scale_checkpoint  # noqa: E402
import scale_script  # noqa: E402
import scale_startup  # noqa: E402
import scale_steps  # noqa: E402
from scale_common import JUPITER_NODES, JUPITER_RANKS, RESULTS, fits, plot, save  # noqa: E402

IMG = RESULTS.parent
SIZES = {  # (quick, full)
    "startup": ((64, 256, 1024), (256, 1024, 4096, 12288, 16384, 24000)),
    "startup_eager": ((32, 64, 128), (64, 128, 256, 512)),
    "monitor": ((64, 256, 1024), (256, 1024, 4096, 24000)),
    "agreement": ((64, 256, 1024), (256, 1024, 4096, 24000)),
    "checkpoint": ((64, 256, 1024), (256, 1024, 4096, 24000)),
    "dcp": ((16, 64, 256), (64, 256, 1024)),
    "after_nodes": ((16, 64, 256), (64, 256, 1024, 6000)),
    "script_nodes": ((16, 256, 6000), (16, 256, 1024, 6000)),
}

# What each curve is held to at 24,000 ranks (issue: budgets), in the unit of its field.
BUDGETS = {
    ("startup", "server_cpu_s"): 60.0,
    ("monitor_exchange", "per_step_ms"): 10.0,      # 1% of a 1-second step
    ("stop_agreement", "periods"): 2.0,
    ("checkpoint", "metadata_s"): 5.0,
    ("after_status", "s"): 2.0,
    ("after_report", "s"): 60.0,
    ("after_report", "peak_mb"): 1024.0,
}


STARTUP_MODES = ("srun-nccl-lazy", "run-nccl-lazy", "srun-nccl-eager")


def run(full: bool, old_src: Path | None, steps: set[str], modes: tuple[str, ...] = STARTUP_MODES) -> list[dict[str, Any]]:
    k = 1 if full else 0
    rows: list[dict[str, Any]] = []
    if "startup" in steps:
        problems = scale_startup.check_against_recording()
        if problems:
            raise SystemExit("the start-up templates differ from the recording:\n" + "\n".join(problems))
        for mode in modes:
            sizes = SIZES["startup_eager" if "eager" in mode else "startup"][k]
            for n in sizes:
                for backend in ("libuv", "legacy"):
                    if backend == "legacy" and n > 12288 and full:
                        # its poll() loop: 215 s of server CPU at 12,288; at 16,384 it reset the
                        # clients' connections after minutes (recorded in docs/scale.md)
                        continue
                    row = scale_startup.replay(mode, n, backend)
                    rows.append(row)
                    print(row, flush=True)
        save(rows)
    if "steps" in steps:
        sizes = list(SIZES["monitor"][k])
        for label, src in [("now", None)] + ([("before (39e04f3)", old_src)] if old_src else []):
            for row in scale_steps.exchange_rows(sizes, src=src, label=label):
                row["per_step_ms"] = row["cpu_s"] * 1e3 / scale_steps.EVERY   # exchanged every 100 steps
                rows.append(row)
        for n in SIZES["agreement"][k]:
            trials = [scale_steps.agreement_delay(n, seed=s) for s in range(3)]
            rows.append({"step": "stop_agreement", "series": "sync periods, signal to agreement (worst of 3)",
                         "n": n, "periods": max(t["periods"] for t in trials),
                         "bytes_per_rank": trials[0]["bytes_per_rank"]})
            print(rows[-1], flush=True)
        save(rows)
    if "checkpoint" in steps:
        for n in SIZES["checkpoint"][k]:
            row = {"step": "checkpoint", "series": "now", **scale_checkpoint.measure(n)}
            row["metadata_s"] = row["commit_s"]
            rows.append(row)
            print(row, flush=True)
        for n in SIZES["dcp"][k]:
            row = {"step": "dcp_metadata", "series": "64 items per rank", **scale_checkpoint.dcp_metadata(n, 64)}
            row["metadata_s"] = row["plan_s"] + row["finish_s"]
            rows.append(row)
            print(row, flush=True)
        save(rows)
    if "after" in steps:
        for nodes in SIZES["after_nodes"][k]:
            with tempfile.TemporaryDirectory() as tmp:
                run_dir = Path(tmp) / "run"
                sizes = scale_after.generate(run_dir, nodes, 1.0 if full else 0.25)
                for label, src in [("now", None)] + ([("before (39e04f3)", old_src)] if old_src else []):
                    for verb in ("status", "logs", "report", "samplers"):
                        out = scale_after.measure(run_dir, verb, src=src)
                        rows.append({"step": f"after_{verb}", "series": label, "n": nodes * 4, "nodes": nodes,
                                     "s": out["s"], "peak_mb": out["peak_mb"], "result": out["result"],
                                     **{f"{key}_mb": v / 2**20 for key, v in sizes.items()}})
                        print(rows[-1], flush=True)
        save(rows)
    if "script" in steps:
        launchers = scale_script.LAUNCHERS if full else ("scaletrain", "scaletrain-run", "tensorflow")
        for launcher in launchers:
            for nodes in SIZES["script_nodes"][k]:
                rows.append(scale_script.measure(nodes, launcher))
                print(rows[-1], flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: per curve, its exponent, the projection at 24,000 ranks and the budget."""
    out = ["| step | series | value | N measured | exponent k | at 24,000 ranks | budget |",
           "|---|---|---|---|---:|---:|---|"]
    curves = [("startup", "server_cpu_s"), ("startup", "server_mem_mb"), ("startup", "requests"),
              ("monitor_exchange", "per_step_ms"), ("monitor_exchange", "recv_bytes"),
              ("stop_agreement", "periods"), ("checkpoint", "commit_s"), ("checkpoint", "marker_bytes"),
              ("checkpoint", "choose_sizes_s"), ("checkpoint", "status_s"), ("checkpoint", "report_s"),
              ("checkpoint", "resume_walk_s"), ("checkpoint", "retention_s"), ("dcp_metadata", "metadata_s"),
              ("dcp_metadata", "gathered_bytes"), ("after_status", "s"), ("after_logs", "s"), ("after_report", "s"),
              ("after_report", "peak_mb"), ("after_samplers", "s"), ("script", "plan_s"), ("script", "task_s")]
    for step, value in curves:
        mine = [r for r in rows if r["step"] == step and r.get(value) is not None and not r.get("skipped")]
        for series, fit in fits(mine, value, at=JUPITER_RANKS).items():
            k = fit["exponent"]
            budget = BUDGETS.get((step, value))
            proj = fit["projected"]
            verdict = "" if budget is None or proj is None else (
                f"{budget:g}: {'holds' if proj <= budget else 'exceeds'}")
            out.append(f"| {step} | {series} | {value} | {', '.join(str(n) for n in fit['n'])} | "
                       f"{'-' if k is None else f'{k:.2f}'} | {'-' if proj is None else f'{proj:.4g}'} | {verdict} |")
    return out


def plots(rows: list[dict[str, Any]]) -> None:
    charts = [("startup", "server_cpu_s", "s", "start-up: store server CPU time (replayed clients)", 60.0),
              ("monitor_exchange", "per_step_ms", "ms per step", "Monitor exchange: per 1-s step, every 100 steps", 10.0),
              ("monitor_exchange", "recv_bytes", "bytes", "Monitor exchange: bytes a rank receives", None),
              ("stop_agreement", "periods", "sync periods", "stop agreement: signal to agreed stop", 2.0),
              ("dcp_metadata", "metadata_s", "s", "DCP metadata step on the coordinator (64 items/rank)", 5.0),
              ("script", "task_s", "s", "per-node task start-up work (bash -c of the script)", None)]
    composite = [("checkpoint", ["commit_s", "choose_sizes_s", "status_s", "report_s", "resume_walk_s", "retention_s"],
                  "checkpoint of N ranks (2N+2 files): rank 0's steps, local disk", "scale-checkpoint-steps.png"),
                 ("after_", ["s"], "after the job: status, logs, report, samplers (1 h, 4 ranks a node)",
                  "scale-after-verbs.png")]
    for prefix, values, title, name in composite:
        pseudo = [{"step": prefix, "series": (f"{r['step'][len(prefix):]}, {r['series']}" if prefix.endswith("_")
                                              else v.removesuffix("_s")), "n": r["n"], "v": r[v]}
                  for r in rows if r["step"].startswith(prefix) for v in values if r.get(v) is not None]
        if pseudo:
            plot(title, pseudo, "v", "s", IMG / name, at=JUPITER_NODES * 4)
    for step, value, unit, title, budget in charts:
        mine = [r for r in rows if r["step"] == step and r.get(value) is not None and not r.get("skipped")]
        if mine:
            plot(title, mine, value, unit, IMG / f"scale-{step.replace('_', '-')}-{value.replace('_', '-')}.png",
                 budget=budget, at=JUPITER_NODES * 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the sizes of docs/scale.md (hours on two cores)")
    parser.add_argument("--old-src", type=Path, help="another scaletrain's src folder to measure beside this one")
    parser.add_argument("--steps", default="startup,steps,checkpoint,after,script")
    parser.add_argument("--startup-modes", default=",".join(STARTUP_MODES))
    parser.add_argument("--plots-only", action="store_true")
    args = parser.parse_args()
    import json

    if not args.plots_only:
        save(run(args.full, args.old_src.resolve() if args.old_src else None, set(args.steps.split(",")),
                 tuple(args.startup_modes.split(","))))
    rows = json.loads(RESULTS.read_text())
    plots(rows)
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
