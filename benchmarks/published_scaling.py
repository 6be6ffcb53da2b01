"""Published multi-GPU scaling tables, and the scaling model's error on each (before and after).

Each table is data as published: the source, the date it was read, the hardware, the 1-GPU
step the model starts from, the gradient bytes, the links, and the measured efficiencies. The
procedure is what a user does: calibrate the distributed overhead on the table's own one-node
point (its 2-GPU point, or its one node), then predict the other points, multi-node above all.
``tests/unit/test_scaling_published.py`` checks the errors; ``benchmarks/scaling_model.py``
prints the tables of docs/benchmarks.md.

    python benchmarks/published_scaling.py
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from scaletrain.observe.overhead import NONE, Overhead, calibrate  # noqa: E402
from scaletrain.observe.scaling import (INTER_ACHIEVED, INTRA_ACHIEVED, Links, StepProfile,  # noqa: E402
                                        modelled_without_overhead, predict)

TXL = ("NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/Transformer-XL/README.md, "
       "'Training performance: NVIDIA DGX-2H (16x V100 32GB)' and '8x NVIDIA DGX-2H' "
       "(github.com/NVIDIA/DeepLearningExamples; pytorch-20.06-py3 container)")
JSC = ("JSC course 'Parallelize Training' (seed 004 in ../shared/seeds): 'time srun python3 gpu_training.py' "
       "real times, ResNet-50, 10 ImageNet epochs, batch 256 per GPU, JUWELS Booster")
BART = ("NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/BART/README.md, 'Pre-training performance: "
        "Single-node / Multi-node on NVIDIA DGX A100 (8x A100 80GB)' (PyTorch 22.08-py3 container)")
READ = "2026-11-27"
# DGX-2H: NVSwitch, 300 GB/s NVLink per GPU (both directions); 8 x 100 Gb/s EDR InfiniBand per
# node. Both rates are NVIDIA's DGX-2 datasheet figures as remembered: unconfirmed.
DGX2H = {"intra_gbps": 2400.0, "inter_gbps": 800.0, "gpus_per_node": 16}
# DGX A100: NVLink 3 (600 GB/s per GPU) and 8 x HDR 200 Gb/s per node, as remembered: unconfirmed
DGXA100 = {"intra_gbps": 4800.0, "inter_gbps": 1600.0, "gpus_per_node": 8}
# JUWELS Booster, from the juwels-booster profile (quoted there): NVLink 3, 4 x HDR200 per node
JUWELS = {"intra_gbps": 4800.0, "inter_gbps": 800.0, "gpus_per_node": 4}
# Transformer-XL parameters: base 0.151e9 and large 0.257e9 in the Transformer-XL paper (Dai et
# al. 2019, Table 1) for the original base; NVIDIA's base is a little wider. Unconfirmed, and of
# little weight: on NVSwitch and 8 x EDR the model hides the all-reduce either way.
TXL_BASE_PARAMS = 0.19e9
TXL_LARGE_PARAMS = 0.257e9
RESNET50_PARAMS = 25_557_032    # torchvision resnet50
BART_LARGE_PARAMS = 0.406e9     # BART-large, as remembered: unconfirmed (hidden behind 160 GB/s either way)


@dataclass(frozen=True, kw_only=True)
class Table:
    """One published scaling table, as the model needs it."""

    key: str
    source: str
    hardware: dict[str, float]
    grad_bytes: int
    points: tuple[tuple[int, float], ...]   # (GPUs, measured efficiency against base_n)
    base_n: int = 1
    step_s: float | None = None             # measured step at base_n GPUs
    calibration_n: int | None = None        # the one-node point a user would calibrate on
    calibrated_by: str | None = None        # ... or another table's calibration (same node, precision)
    kind: str = "steps"     # "steps": steady-state steps; "job": whole-job wall times; "accumulated":
    note: str = ""          # steps of an unstated gradient accumulation (all-reduce once per several)

    @property
    def per_step(self) -> bool:
        """Steady-state steps of one all-reduce each: what the aim is measured on."""
        return self.kind == "steps"

    def links(self) -> Links:
        hw = self.hardware
        return Links(intra_gbs=hw["intra_gbps"] / 8 * INTRA_ACHIEVED, inter_gbs=hw["inter_gbps"] / 8 * INTER_ACHIEVED,
                     devices_per_node=int(hw["gpus_per_node"]))

    def measured_step(self, n: int) -> float:
        """Step time at ``n`` GPUs from the table (weak scaling: the per-GPU batch stays)."""
        eff = dict(self.points)[n] if n != self.base_n else 1.0
        assert self.step_s is not None
        return self.step_s / eff


# Transformer-XL on one DGX-2H: (model, precision) -> (batch per GPU, tokens per sample,
# 1-GPU tok/s, gradient bytes per parameter, parameters, weak-scaling speed-ups at 2, 4, 8, 16 GPUs)
TXL_ONE_NODE = {
    ("base", "fp32"): (16, 192, 16_150, 4, TXL_BASE_PARAMS, (1.840, 3.592, 7.099, 13.803)),
    ("base", "mixed"): (16, 192, 32_875, 2, TXL_BASE_PARAMS, (1.796, 3.467, 6.811, 12.623)),
    ("large", "fp32"): (8, 384, 5_169, 4, TXL_LARGE_PARAMS, (1.930, 3.810, 7.576, 15.008)),
    ("large", "mixed"): (8, 384, 14_787, 2, TXL_LARGE_PARAMS, (1.874, 3.666, 7.241, 14.296)),
}
# ... on 1, 2, 4, 8 DGX-2H (large model, batch 4 x 384 tokens per GPU): precision -> (one node's
# tok/s, weak-scaling speed-ups at 2, 4, 8 nodes against one node)
TXL_NODES = {"fp32": (69_070, (1.98, 3.91, 7.45)), "mixed": (154_950, (1.98, 3.91, 7.68))}


def _txl_tables() -> list[Table]:
    out = []
    for (size, prec), (batch, tokens, tok_s, per_param, params, speedups) in TXL_ONE_NODE.items():
        out.append(Table(key=f"txl-{size}-{prec}", source=f"{TXL}, {size} model, {prec}, batch {batch} x {tokens} "
                         "tokens per GPU", hardware=DGX2H, grad_bytes=int(params * per_param),
                         step_s=batch * tokens / tok_s, calibration_n=2,
                         points=tuple((n, x / n) for n, x in zip((2, 4, 8, 16), speedups))))
    for prec, (tok_s, speedups) in TXL_NODES.items():
        # efficiency against one node; the user's calibration is the one-node table's 2-GPU run
        # of the same model and precision (batch 8 there, 4 here)
        out.append(Table(key=f"txl-large-{prec}-nodes", source=f"{TXL}, large model, {prec}, 1-8 nodes",
                         hardware=DGX2H, grad_bytes=int(TXL_LARGE_PARAMS * (4 if prec == "fp32" else 2)),
                         base_n=16, step_s=4 * 384 / (tok_s / 16), calibrated_by=f"txl-large-{prec}",
                         points=tuple((16 * k, x / k) for k, x in zip((2, 4, 8), speedups))))
    return out


# BART pre-training on DGX A100: (sequence length, precision) -> (batch per GPU, 1-GPU sequences/s,
# 8-GPU weak scaling, weak scaling of 20 and 40 nodes against one node). Its pre-training script
# accumulates gradients (40 steps by default, all-reduce once after them); the benchmark rows do
# not say with how many, so these are not counted as per-step tables.
BART_RUNS = {
    (128, "tf32"): (100, 202.53, 7.68, (19.96, 39.54)),
    (128, "bf16"): (200, 326.53, 7.88, (20.39, 37.71)),
    (512, "tf32"): (16, 41.35, 7.69, (18.73, 36.61)),
    (512, "bf16"): (32, 69.31, 7.93, (19.14, 36.29)),
}


def _bart_tables() -> list[Table]:
    out = []
    for (seq, prec), (batch, seq_s, eff8, nodes) in BART_RUNS.items():
        key = f"bart-{seq}-{prec}"
        step1 = batch / seq_s
        common = {"hardware": DGXA100, "grad_bytes": int(BART_LARGE_PARAMS * 4), "kind": "accumulated",
                  "note": "gradient accumulation not stated for these rows"}
        out.append(Table(key=key, source=f"{BART}, sequence {seq}, {prec}, batch {batch} per GPU", step_s=step1,
                         calibration_n=8, points=((8, eff8 / 8),), **common))
        out.append(Table(key=f"{key}-nodes", source=f"{BART}, sequence {seq}, {prec}, 1, 20, 40 nodes", base_n=8,
                         step_s=step1 / (eff8 / 8), calibrated_by=key,
                         points=tuple((8 * k, x / k) for k, x in zip((20, 40), nodes)), **common))
    return out


JSC_MINUTES = ((1, 342 + 11.864 / 60), (4, 89 + 15.923 / 60), (16, 24 + 48.169 / 60), (32, 13 + 10.722 / 60),
               (64, 6 + 56.457 / 60), (128, 4 + 48.313 / 60))
TABLES = (
    *_txl_tables(),
    # wall times of whole 10-epoch jobs: start-up, data loading and validation are inside them
    Table(key="jsc-resnet50", source=JSC, hardware=JUWELS, grad_bytes=RESNET50_PARAMS * 4,
          step_s=JSC_MINUTES[0][1] * 60 / 50045, calibration_n=4, kind="job",
          points=tuple((n, JSC_MINUTES[0][1] / (n * m)) for n, m in JSC_MINUTES[1:]),
          note="wall time of the whole job: per-job start-up and per-epoch pauses do not shrink with N"),
    *_bart_tables(),
)
BY_KEY = {t.key: t for t in TABLES}
# DEFAULT_FRACTION's data: each table's own calibration, except where an unstated gradient
# accumulation spreads the overhead over several steps (it would understate a plain step's)
FRACTION_TABLES = tuple(t for t in TABLES if not t.calibrated_by and t.kind != "accumulated")


def _step1(table: Table, overhead: Overhead) -> StepProfile:
    """The 1-GPU step the model starts from: measured, or (a table against one node) the
    one-node step less the model's own costs at that size."""
    assert table.step_s is not None
    if table.base_n == 1:
        return StepProfile(compute_s=table.step_s, grad_bytes=table.grad_bytes)
    probe = StepProfile(compute_s=table.step_s, grad_bytes=table.grad_bytes)
    extra = predict(probe, table.links(), table.base_n, overhead=overhead).step_s - table.step_s
    return StepProfile(compute_s=table.step_s - extra, grad_bytes=table.grad_bytes)


def calibration(table: Table) -> Overhead:
    """What the user's one-node run gives: the overhead fitted on the table's own one-node point."""
    if table.calibrated_by:
        return calibration(BY_KEY[table.calibrated_by])
    assert table.calibration_n is not None
    step = StepProfile(compute_s=table.step_s or 0.0, grad_bytes=table.grad_bytes)
    n = table.calibration_n
    return calibrate(table.measured_step(n), modelled_without_overhead(step, table.links(), n), n,
                     step_s=step.compute_s, source=f"{table.key} at {n} GPUs")


def evaluate(table: Table, model: str) -> list[dict[str, float]]:
    """Per point: measured and predicted efficiency (against base_n), for ``model`` "old" (no
    overhead term), "default" (published default, uncalibrated) or "calibrated"."""
    overhead = {"old": NONE, "default": Overhead()}.get(model) or calibration(table)
    step = _step1(table, overhead)
    links = table.links()
    base = predict(step, links, table.base_n, overhead=overhead)
    rows = []
    for n, measured in table.points:
        p = predict(step, links, n, overhead=overhead)
        # efficiency against base_n, as the table gives it, each end of the range against its own
        rows.append({"n": n, "nodes": p.nodes, "measured": measured, "predicted": p.efficiency / base.efficiency,
                     "low": p.efficiency_low / base.efficiency_low, "high": p.efficiency_high / base.efficiency_high,
                     "calibration": float(n == table.calibration_n and not table.calibrated_by)})
    return rows


def largest_above(effs: list[tuple[int, float]], threshold: float) -> int:
    """The largest N whose efficiency is at least ``threshold`` (the base size at worst)."""
    return max([n for n, e in effs if e >= threshold] or [min(n for n, _ in effs)])


def summary(model: str, *, multi_node_only: bool = True, kinds: tuple[str, ...] = ("steps",)) -> tuple[float, float, int]:
    """(mean absolute error in points, worst error, points) over the non-calibration points of the
    tables of ``kinds``."""
    errs = []
    for t in TABLES:
        if t.kind not in kinds:
            continue
        for r in evaluate(t, model):
            if r["calibration"] or (multi_node_only and r["nodes"] <= 1):
                continue
            errs.append(abs(r["predicted"] - r["measured"]) * 100)
    return sum(errs) / len(errs), max(errs), len(errs)


def _growth_points(table: Table) -> list[tuple[float, float]]:
    """(log2(N/2), overhead(N)/overhead(2) - 1) for each point of a table measured from 1 GPU."""
    step = StepProfile(compute_s=table.step_s or 0.0, grad_bytes=table.grad_bytes)
    links = table.links()
    o = {n: table.measured_step(n) - modelled_without_overhead(step, links, n) for n, _ in table.points}
    return [(math.log2(n / 2), o[n] / o[2] - 1) for n in o if n > 2]


def fit_growth(table: Table) -> float:
    """Least-squares growth per doubling of a table's overhead (GROWTH is the median over tables)."""
    xs = _growth_points(table)
    return sum(x * y for x, y in xs) / sum(x * x for x, _ in xs)


def point_growths(table: Table) -> list[float]:
    """The growth each point alone implies (GROWTH_RANGE spans them all: the calibrated range)."""
    return [y / x for x, y in _growth_points(table)]


def fraction_at_two(table: Table) -> float:
    """The calibrated overhead at 2 GPUs as a fraction of the 1-GPU step (the DEFAULT_FRACTION data)."""
    cal = calibration(table)
    assert cal.at_two_s is not None
    return cal.at_two_s / _step1(table, cal).compute_s


def main() -> None:
    for t in TABLES:
        print(f"\n{t.key}: {t.source}" + (f" ({t.note})" if t.note else ""))
        old, default, cal = (evaluate(t, m) for m in ("old", "default", "calibrated"))
        print("| GPUs | nodes | measured | old model | error | default (range) | error | calibrated (range) | error |")
        print("|---|---|---|---|---|---|---|---|---|")
        for o, d, c in zip(old, default, cal):
            tag = " (calibration)" if c["calibration"] else ""
            print(f"| {o['n']} | {o['nodes']} | {o['measured'] * 100:.1f}% | {o['predicted'] * 100:.1f}% "
                  f"| {(o['predicted'] - o['measured']) * 100:+.1f} | {d['predicted'] * 100:.1f}% "
                  f"({d['low'] * 100:.0f}-{d['high'] * 100:.0f}) | {(d['predicted'] - d['measured']) * 100:+.1f} "
                  f"| {c['predicted'] * 100:.1f}%{tag} ({c['low'] * 100:.0f}-{c['high'] * 100:.0f}) "
                  f"| {(c['predicted'] - c['measured']) * 100:+.1f} |")
    print("\n| model | per-step tables, multi-node | per-step tables, all | JSC (whole jobs), multi-node "
          "| BART (accumulated), multi-node |")
    print("|---|---|---|---|---|")
    for m in ("old", "default", "calibrated"):
        cells = [summary(m), summary(m, multi_node_only=False), summary(m, kinds=("job",)),
                 summary(m, kinds=("accumulated",))]
        print(f"| {m} | " + " | ".join(f"mean {a:.1f}, worst {b:.1f} ({k} points)" for a, b, k in cells) + " |")
    growth = {t.key: (round(fit_growth(t), 3), [round(g, 3) for g in point_growths(t)])
              for t in TABLES if t.base_n == 1 and t.calibration_n == 2}
    fractions = {t.key: round(fraction_at_two(t), 3) for t in FRACTION_TABLES}
    print(f"\ngrowth per doubling, fitted per table (and per point): {growth}\noverhead at 2 GPUs / 1-GPU step: {fractions}")


if __name__ == "__main__":
    main()
