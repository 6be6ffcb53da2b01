"""The scaling model against published multi-GPU tables: the protocol's procedure and its figures.

The tables and which of them fit the constants, which are held out and which lie outside what the
model can see are data in ``published_tables.py``. The procedure is a user's: without a calibration
the model starts from the 1-GPU step and the published default; calibrated, it first fits the
distributed overhead on the table's own one-node point (its 2-GPU point, or its smallest multi-GPU
one), then predicts the rest. ``tests/unit/test_scaling_published.py`` checks the figures;
``python benchmarks/published_scaling.py`` prints docs/benchmarks.md's tables.

    python benchmarks/published_scaling.py               # the model in ../src
    SCALETRAIN_SRC=/path/to/old/src python benchmarks/published_scaling.py   # another version's model
"""

from __future__ import annotations

import inspect
import math
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, os.environ.get("SCALETRAIN_SRC") or str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from published_tables import BY_KEY, FIT, HELD_OUT, OUTSIDE, TABLES, Table  # noqa: E402
from scaletrain.observe.overhead import NONE, Overhead, calibrate  # noqa: E402
from scaletrain.observe import scaling  # noqa: E402
from scaletrain.observe.scaling import (INTER_ACHIEVED, INTRA_ACHIEVED, Links, StepProfile,  # noqa: E402
                                        modelled_without_overhead, predict)


def exposed_communication(step: StepProfile, links: Links, n: int, *, share: float = 1.0) -> float:
    return scaling._step(step, links, n, share)[3]

MODELS = ("old", "default", "calibrated")   # no overhead term; the published default; calibrated on one node
TOLERANCE = 0.005       # the printed range is in whole percent: a value within half a point of it is inside


def links(table: Table, n: int) -> Links:
    """The table's links as the model takes them, at ``n`` GPUs: with k micro-batches per all-reduce only
    the last one's backward can hide it."""
    hw = table.hardware
    micro = table.micro.get(n, table.micro.get(0, 1))
    return Links(intra_gbs=hw["intra_gbps"] / 8 * INTRA_ACHIEVED, inter_gbs=hw["inter_gbps"] / 8 * INTER_ACHIEVED,
                 devices_per_node=int(hw["gpus_per_node"]), overlap=0.8 / micro)


def share(table: Table, n: int) -> float:
    return table.shares.get(n, 1.0)


def measured_step(table: Table, n: int) -> float:
    """The step at ``n`` GPUs the table implies: efficiency = share x base step / step."""
    eff = 1.0 if n == table.base_n else dict(table.points)[n]
    return table.step_s * share(table, n) / share(table, table.base_n) / eff


def step1(table: Table, overhead: Overhead) -> StepProfile:
    """The 1-GPU step the model starts from: measured, or (a table against one node) the one-node
    step less the model's own costs there."""
    if table.base_n == 1:
        return StepProfile(compute_s=table.step_s, grad_bytes=table.grad_bytes)
    probe = StepProfile(compute_s=table.step_s, grad_bytes=table.grad_bytes)
    extra = predict(probe, links(table, table.base_n), table.base_n, overhead=overhead).step_s - table.step_s
    return StepProfile(compute_s=table.step_s - extra, grad_bytes=table.grad_bytes)


def calibration(table: Table, spread: float | None = None) -> Overhead:
    """What the user's one-node run gives: the overhead fitted on the table's own one-node point
    (``spread``: another calibration spread than the model's, to show what fits it)."""
    if table.calibrated_by:
        return calibration(BY_KEY[table.calibrated_by], spread)
    n = table.calibration_n
    assert n is not None
    step = StepProfile(compute_s=table.step_s, grad_bytes=table.grad_bytes)
    s = share(table, n)
    # another version's model (SCALETRAIN_SRC, the "before" figures) may not count exposed communication once
    exposed = ({"exposed_s": exposed_communication(step, links(table, n), n, share=s)}
               if "exposed_s" in inspect.signature(calibrate).parameters else {})
    cal = calibrate(measured_step(table, n), modelled_without_overhead(step, links(table, n), n, share=s), n,
                    step_s=step.compute_s * s, source=f"{table.key} at {n} GPUs", **exposed)
    return cal if spread is None else replace(cal, spread=spread)


def overhead_for(table: Table, model: str, spread: float | None = None) -> Overhead:
    return {"old": NONE, "default": Overhead()}.get(model) or calibration(table, spread)


def evaluate(table: Table, model: str, spread: float | None = None) -> list[dict[str, float]]:
    """Per point: measured and predicted efficiency against base_n (the middle and both ends)."""
    overhead = overhead_for(table, model, spread)
    step = step1(table, overhead)
    base = predict(step, links(table, table.base_n), table.base_n, share=share(table, table.base_n), overhead=overhead)
    rows = []
    for n, measured in table.points:
        p = predict(step, links(table, n), n, share=share(table, n), overhead=overhead)
        rows.append({"n": n, "nodes": p.nodes, "measured": measured, "predicted": p.efficiency / base.efficiency,
                     "low": p.efficiency_low / base.efficiency_low, "high": p.efficiency_high / base.efficiency_high,
                     "calibration": float(n == table.calibration_n and not table.calibrated_by)})
    return rows


def scored(tables: tuple[Table, ...] | list[Table], model: str, *, multi_node_only: bool = False,
           spread: float | None = None) -> list[dict[str, float]]:
    """The points a model is judged on: every point but the calibrating one (calibrated), each with its table."""
    out = []
    for t in tables:
        for r in evaluate(t, model, spread):
            if (model == "calibrated" and r["calibration"]) or (multi_node_only and r["nodes"] <= 1):
                continue
            out.append(dict(r, table=t.key))    # type: ignore[arg-type]
    return out


def summary(tables: tuple[Table, ...] | list[Table], model: str, **kw: Any) -> dict[str, float]:
    """Mean and worst error of the middle (points), how often the range holds the published value, and
    the worst optimistic low end (points above the published value), over ``tables``."""
    rows = scored(tables, model, **kw)
    errs = [abs(r["predicted"] - r["measured"]) * 100 for r in rows]
    inside = [r["low"] - TOLERANCE <= r["measured"] <= r["high"] + TOLERANCE for r in rows]
    return {"points": len(rows), "mean": statistics.fmean(errs), "worst": max(errs),
            "coverage": sum(inside) / len(rows), "optimistic_low": max((r["low"] - r["measured"]) * 100 for r in rows)}


def kind(tables: tuple[Table, ...], *kinds: str) -> list[Table]:
    return [t for t in tables if t.kind in kinds]


def largest_above(effs: list[tuple[int, float]], threshold: float) -> int:
    """The largest N whose efficiency is at least ``threshold`` (the base size at worst)."""
    return max([n for n, e in effs if e >= threshold] or [min(n for n, _ in effs)])


def larger_than_measured(tables: list[Table], model: str, thresholds: tuple[float, ...] = (0.8, 0.85, 0.9, 0.95)) -> list[tuple[str, float, int, int]]:
    """(table, threshold, chosen, measured) wherever the range's low end picks a larger N than the table."""
    out = []
    for t in tables:
        rows = evaluate(t, model)
        base = [(t.base_n, 1.0)]
        for th in thresholds:
            measured = largest_above(base + [(r["n"], r["measured"]) for r in rows], th)
            chosen = largest_above(base + [(r["n"], r["low"]) for r in rows], th)
            if chosen > measured:
                out.append((t.key, th, chosen, measured))
    return out


# ---- fitting (on FIT only) ----------------------------------------------------------------------

def overhead_at(table: Table, n: int) -> float:
    """The overhead the table shows at ``n`` beyond the model's own terms (seconds per step)."""
    step = StepProfile(compute_s=table.step_s, grad_bytes=table.grad_bytes)
    s = share(table, n)
    return measured_step(table, n) - modelled_without_overhead(step, links(table, n), n, share=s)


def growth_points(table: Table) -> list[tuple[float, float]]:
    """(log2(N/2), overhead(N)/overhead(calibration) scaled to 2 GPUs - 1) for a table measured from 1 GPU."""
    from scaletrain.observe.overhead import GROWTH

    c = table.calibration_n
    assert c is not None
    at2 = overhead_at(table, c) / (1 + GROWTH * math.log2(c / 2))
    return [(math.log2(n / 2), overhead_at(table, n) / at2 - 1) for n, _ in table.points if n > c]


def fit_growth(table: Table) -> float:
    """Least-squares growth per doubling of a table's overhead."""
    xs = growth_points(table)
    return sum(x * y for x, y in xs) / sum(x * x for x, _ in xs)


def one_gpu_tables(tables: tuple[Table, ...]) -> list[Table]:
    return [t for t in tables if t.base_n == 1 and not t.calibrated_by and t.kind == "steps" and len(t.points) > 1]


def fraction_at_reference(table: Table) -> float:
    """The calibrated overhead at 2 GPUs as a fraction of the reference step (the default's data)."""
    from scaletrain.observe.overhead import REFERENCE_STEP_S, STEP_EXPONENT

    cal = calibration(table)
    assert cal.at_two_s is not None and cal.at_step_s is not None
    at_reference = cal.at_two_s * (REFERENCE_STEP_S / cal.at_step_s) ** STEP_EXPONENT
    return at_reference / REFERENCE_STEP_S


def main() -> None:
    for t in TABLES:
        where = "fit" if t in FIT else "held out" if t in HELD_OUT else "outside"
        print(f"\n{t.key} ({where}): {t.source}" + (f" ({t.note})" if t.note else ""))
        old, default, cal = (evaluate(t, m) for m in MODELS)
        print("| GPUs | nodes | measured | old model | default (range) | calibrated (range) |")
        print("|---|---|---|---|---|---|")
        for o, d, c in zip(old, default, cal):
            tag = " (calibration)" if c["calibration"] else ""
            print(f"| {o['n']} | {o['nodes']} | {o['measured'] * 100:.1f}% | {o['predicted'] * 100:.1f}% "
                  f"| {d['predicted'] * 100:.1f}% ({d['low'] * 100:.0f}-{d['high'] * 100:.0f}) "
                  f"| {c['predicted'] * 100:.1f}%{tag} ({c['low'] * 100:.0f}-{c['high'] * 100:.0f}) |")
    print("\n| set | model | points | mean error | worst | range holds | worst optimistic low end |")
    print("|---|---|---|---|---|---|---|")
    for name, tables in (("fit, per step", kind(FIT, "steps")), ("fit, accumulated", kind(FIT, "accumulated")),
                         ("held out, per step", kind(HELD_OUT, "steps")),
                         ("held out, accumulated", kind(HELD_OUT, "accumulated")),
                         ("held out, every table", list(HELD_OUT)),
                         ("held out, whole jobs (JSC)", kind(HELD_OUT, "job")), ("outside", list(OUTSIDE))):
        for m in MODELS:
            s = summary(tables, m)
            print(f"| {name} | {m} | {s['points']} | {s['mean']:.1f} | {s['worst']:.1f} | "
                  f"{s['coverage'] * 100:.0f}% | {s['optimistic_low']:+.1f} |")
    for m in ("default", "calibrated"):
        print(f"\nlargest N above 80-95% larger than measured ({m}): {larger_than_measured(list(HELD_OUT), m)}")


if __name__ == "__main__":
    main()
