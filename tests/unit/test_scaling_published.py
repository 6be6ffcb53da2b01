"""The scaling model against published multi-GPU tables: the fit set, the held-out set, the protocol.

The tables, their sources and which fit the constants and which are held out are data in
benchmarks/published_tables.py; the procedure (calibrate on a table's own one-node point, or start
from the published default, then predict the rest) is benchmarks/published_scaling.py, which also
prints docs/benchmarks.md's tables. The model of 39e04f3 took the overhead from the whole 1-GPU
step under strong scaling and fails the BERT test here (13.6% at 256 GPUs, 93.1% measured).
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
from pathlib import Path

import pytest

from scaletrain.observe import overhead as ov

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def published():
    names = ("published_tables", "published_scaling")
    saved = list(sys.path)
    try:
        for name in names:      # dataclasses look their module up by name
            spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        yield sys.modules["published_scaling"]
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.path[:] = saved


@pytest.fixture(scope="module")
def tables(published):
    return sys.modules["published_tables"]


def _steps(ts):
    return [t for t in ts if t.kind == "steps"]


def test_the_tables_are_the_published_figures(tables):
    # spot checks against the READMEs' rows, so that a transcription slip fails here
    by = tables.BY_KEY
    assert dict(by["txl-large-mixed"].points)[16] == pytest.approx(14.296 / 16)
    assert dict(by["txl-large-fp32-nodes"].points)[128] == pytest.approx(7.45 / 8)
    assert dict(by["gnmt-dgx2-mixed"].points)[16] == pytest.approx(852550 / (16 * 72684))
    assert dict(by["bart-512-bf16-nodes"].points)[320] == pytest.approx(36.29 / 40)
    # BERT-large pre-training, 32 DGX A100 (256 GPUs), sequence 128, mixed: 138294 against 580 on 1 GPU
    bert = by["bert-a100-128-mixed"]
    assert dict(bert.points)[256] == pytest.approx(0.931, abs=5e-4)
    assert bert.step_s == pytest.approx(256 * 32 / 580) and bert.shares[256] == pytest.approx(1 / 32)
    assert bert.micro[256] == 1 and bert.micro[8] == bert.micro[0] == 32
    assert by["bert-a100-512-tf32"].micro[256] == 8          # 128 accumulated / 16 per micro-batch
    assert dict(by["bert-v100-squad-dgx2-b4-mixed"].points)[16] == pytest.approx(462.08 / (16 * 38.16))
    assert dict(by["bert-v100-pre-128-nodes"].points)[1024] == pytest.approx(188088.32 / (64 * 3379.2))
    assert dict(by["mxnet-rn50-dgx1-mixed"].points)[2] == pytest.approx(2768 / 2752)
    assert dict(by["jsc-resnet50"].points)[128] == pytest.approx(342.2 / (128 * 4.805), abs=1e-3)
    assert dict(by["ncf-dgx2-mixed"].points)[16] == pytest.approx(133_300_953 / (16 * 21_056_129))


def test_the_protocol_keeps_fit_and_held_out_apart(tables):
    fit, held, outside = tables.FIT, tables.HELD_OUT, tables.OUTSIDE
    assert {t.key for t in fit}.isdisjoint(t.key for t in held)
    # whole sources apart: no model and stack is fitted on one table and judged on another
    assert {t.family for t in fit}.isdisjoint(t.family for t in held)
    assert {t.family for t in outside}.isdisjoint({t.family for t in fit} | {t.family for t in held})
    # at least six sources, weak and strong scaling, several stacks and interconnects, all with a source
    assert len({t.family for t in (*fit, *held)}) >= 6
    assert any(t.strong for t in held) and any(not t.strong for t in held)
    assert {"txl", "gnmt", "bart"} == {t.family for t in fit}
    assert all(t.source and ("github.com/" in t.source or "seed 004" in t.source) for t in tables.TABLES)
    assert all(t.note for t in outside)


def test_constants_are_fits_of_the_fit_set_only(published, tables):
    one_gpu = published.one_gpu_tables(tables.FIT)
    assert ov.GROWTH == pytest.approx(statistics.median(published.fit_growth(t) for t in one_gpu), abs=0.01)
    points = [y / x for t in one_gpu for x, y in published.growth_points(t)]
    assert ov.GROWTH_RANGE[0] <= min(points) <= ov.GROWTH_RANGE[0] + 0.01
    assert ov.GROWTH_RANGE[1] >= max(points) >= ov.GROWTH_RANGE[1] - 0.01
    fractions = [published.fraction_at_reference(t) for t in one_gpu]
    assert ov.DEFAULT_FRACTION == pytest.approx(statistics.median(fractions), abs=0.002)
    every = [published.fraction_at_reference(t) for t in tables.FIT if not t.calibrated_by]
    assert min(every) == pytest.approx(ov.FRACTION_RANGE[0], abs=0.001)
    assert max(every) == pytest.approx(ov.FRACTION_RANGE[1], abs=0.001)
    # the calibration spread: the smallest (in steps of 0.5%) that holds 90% of the fitted points
    fit = list(tables.FIT)
    assert published.summary(fit, "calibrated", spread=ov.CALIBRATION_SPREAD)["coverage"] >= 0.9
    assert published.summary(fit, "calibrated", spread=ov.CALIBRATION_SPREAD - 0.005)["coverage"] < 0.9


def test_step_exponent_is_the_fp32_against_mixed_precision_fit(published, tables):
    exps = []
    for family in ("txl-base", "txl-large", "gnmt-dgx1", "gnmt-dgx2"):
        fp32, mixed = (published.calibration(tables.BY_KEY[f"{family}-{p}"]) for p in ("fp32", "mixed"))
        exps.append(math.log(fp32.at_two_s / mixed.at_two_s) / math.log(fp32.at_step_s / mixed.at_step_s))
    assert min(exps) <= ov.STEP_EXPONENT <= max(exps)
    assert ov.STEP_EXPONENT == pytest.approx(statistics.mean(exps), abs=0.05)


def test_strong_scaling_bert_large_at_256_gpus(published, tables):
    """One global batch split 256 ways: each GPU's step is 1/32 of the 1-GPU step. Measured 93.1%;
    39e04f3's model took its overhead from the whole 1-GPU step and said 13.6%."""
    bert = tables.BY_KEY["bert-a100-128-mixed"]
    for model in ("default", "calibrated"):
        at = {int(r["n"]): r for r in published.evaluate(bert, model)}[256]
        assert at["measured"] == pytest.approx(0.931, abs=5e-4)
        assert at["low"] <= at["measured"] <= at["high"], (model, at)
        assert abs(at["predicted"] - at["measured"]) < 0.11, (model, at)
    # the held-out strong-scaling points, uncalibrated: 20 of 24 within the range; the four outside
    # are sequence 512 in TF32 beyond 4 nodes (75.6% measured at 256 GPUs), under the low end by at
    # most 4.2 points
    strong = [t for t in tables.HELD_OUT if t.strong]
    rows = [dict(r, key=t.key) for t in strong for r in published.evaluate(t, "default")]
    outside = [r for r in rows if not r["low"] - 0.005 <= r["measured"] <= r["high"] + 0.005]
    assert len(rows) == 24 and len(outside) == 4
    assert all(r["key"] == "bert-a100-512-tf32" and r["low"] - r["measured"] <= 0.043 for r in outside)


def test_held_out_per_step_tables_meet_the_range_aims(published, tables):
    """The protocol's report (docs/benchmarks.md): on the held-out per-step tables the range holds 9
    times in 10 and its low end is never more than 5 points above the published value; the middle's
    mean error is 5.3 points uncalibrated (aim 5) and 3.2 calibrated (aim 3): near, not met."""
    held = _steps(tables.HELD_OUT)
    default, cal = (published.summary(held, m) for m in ("default", "calibrated"))
    assert default["points"] == 61 and cal["points"] == 43
    assert default["coverage"] >= 0.9 and cal["coverage"] >= 0.9
    assert default["optimistic_low"] <= 5.0 and cal["optimistic_low"] <= 5.0
    assert default["mean"] <= 5.5 and cal["mean"] <= 3.3
    # the model before the overhead term (no overhead at all) was optimistic at every point
    old = published.scored(held, "old")
    assert all(r["predicted"] >= r["measured"] - 0.01 for r in old)


def test_the_fit_set_itself(published, tables):
    fit = _steps(tables.FIT)
    default, cal = (published.summary(fit, m) for m in ("default", "calibrated"))
    assert default["coverage"] == 1.0 and cal["coverage"] == 1.0
    assert default["mean"] <= 3.0 and cal["mean"] <= 1.2


@pytest.mark.parametrize("model", ["default", "calibrated"])
def test_largest_size_above_threshold_on_held_out_tables(published, tables, model):
    # the recommendation's rule (the range's low end at 80-95%) against the measured largest size:
    # uncalibrated never larger; calibrated larger once, where MXNet on one DGX-2 measured 90.0%
    # at 16 GPUs and the range's low end said 92.6%
    larger = published.larger_than_measured(_steps(tables.HELD_OUT), model)
    assert larger == ([] if model == "default" else [("mxnet-rn50-dgx2-mixed", 0.9, 16, 8)])


def test_whole_job_times_are_outside_a_per_step_range(published, tables):
    # JSC's wall times of 10-epoch jobs hold start-up and per-epoch pauses that do not shrink with N:
    # the per-step range holds them to 64 GPUs uncalibrated, not at 128 (4.8-minute jobs)
    rows = {int(r["n"]): r for r in published.evaluate(tables.BY_KEY["jsc-resnet50"], "default")}
    for n in (16, 32, 64):
        assert rows[n]["low"] <= rows[n]["measured"] <= rows[n]["high"]
    assert rows[128]["low"] > rows[128]["measured"] + 0.15
