"""The scaling model against published multi-GPU scaling tables (issue 36, item 1).

The tables, their sources and inputs are data in benchmarks/published_scaling.py (the same module
prints docs/benchmarks.md's tables). A user's procedure: calibrate the distributed overhead on the
table's own one-node point, predict the rest. The old model (no overhead term) said 100% at every
point of one node and fails these tests.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

import pytest

from scaletrain.observe import overhead as ov

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def published():
    spec = importlib.util.spec_from_file_location("published_scaling", REPO / "benchmarks" / "published_scaling.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["published_scaling"] = module       # dataclasses look the module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("published_scaling", None)


def _per_step(published):
    return [t for t in published.TABLES if t.per_step]


def test_the_tables_are_the_published_figures(published):
    # spot checks against the README's rows, so a transcription slip fails here
    by = published.BY_KEY
    assert dict(by["txl-large-mixed"].points)[16] == pytest.approx(14.296 / 16)
    assert by["txl-large-mixed"].step_s == pytest.approx(8 * 384 / 14_787)
    assert dict(by["txl-base-fp32"].points)[2] == pytest.approx(1.840 / 2)
    assert dict(by["txl-large-fp32-nodes"].points)[128] == pytest.approx(7.45 / 8)
    assert by["txl-large-mixed-nodes"].step_s == pytest.approx(4 * 384 / (154_950 / 16))
    assert dict(by["jsc-resnet50"].points)[128] == pytest.approx(342.2 / (128 * 4.805), abs=1e-3)
    assert dict(by["bart-512-bf16-nodes"].points)[320] == pytest.approx(36.29 / 40)
    assert by["bart-128-tf32"].step_s == pytest.approx(100 / 202.53)
    assert len(published.TABLES) == 15 and sum(len(t.points) for t in published.TABLES) == 39


def test_calibrated_on_one_node_multi_node_error_is_within_three_points(published):
    mean, worst, points = published.summary("calibrated")
    assert points == 6 and mean <= 3.0 and worst <= 3.5
    mean_all, worst_all, _ = published.summary("calibrated", multi_node_only=False)
    assert mean_all <= 1.5 and worst_all <= 4.0      # one node too, from the 2-GPU point alone


def test_uncalibrated_default_and_its_range(published):
    mean, worst, _ = published.summary("default", multi_node_only=False)
    assert mean <= 3.0 and worst <= 10.5
    for table in _per_step(published):
        for r in published.evaluate(table, "default"):
            assert r["low"] - 0.01 <= r["measured"] <= r["high"] + 0.01, (table.key, r)


def test_old_model_was_optimistic_everywhere(published):
    # the model before the overhead term: every point at 100% on one node
    old = [r for t in _per_step(published) for r in published.evaluate(t, "old")]
    assert all(r["predicted"] > r["measured"] for r in old)
    assert published.summary("old", multi_node_only=False)[0] > 8.0


@pytest.mark.parametrize("threshold", [0.8, 0.85, 0.9, 0.95])
@pytest.mark.parametrize("model", ["calibrated", "default"])
def test_largest_size_above_threshold_never_exceeds_the_measured_one(published, threshold, model):
    for table in _per_step(published):
        rows = published.evaluate(table, model)
        base = [(table.base_n, 1.0)]
        measured = published.largest_above(base + [(r["n"], r["measured"]) for r in rows], threshold)
        chosen = published.largest_above(base + [(r["n"], r["low"]) for r in rows], threshold)   # recommend()
        assert chosen <= measured, (table.key, threshold)


def test_jsc_whole_job_times_within_the_default_range_to_sixteen_nodes(published):
    # wall times of 10-epoch jobs: per-job costs are inside them; the per-step model's default range
    # holds them to 64 GPUs, not at 128 (4.8 minutes, docs/benchmarks.md)
    rows = {r["n"]: r for r in published.evaluate(published.BY_KEY["jsc-resnet50"], "default")}
    for n in (16, 32, 64):
        assert rows[n]["low"] <= rows[n]["measured"] <= rows[n]["high"]
    assert rows[128]["low"] > rows[128]["measured"]


def test_bart_multi_node_with_its_unstated_accumulation(published):
    # BART's pre-training accumulates gradients (40 steps by default, one all-reduce after them) and
    # its benchmark rows do not say how many: calibrated on one node, 20 and 40 nodes come within
    # 4.5 points on average, 8.4 at worst; the 3-point aim is not met here (docs/benchmarks.md)
    mean, worst, points = published.summary("calibrated", kinds=("accumulated",))
    assert points == 8 and mean <= 4.5 and worst <= 8.5
    assert published.summary("old", kinds=("accumulated",))[0] > mean


def test_overhead_constants_are_the_fits_of_the_tables(published):
    one_node = [t for t in _per_step(published) if t.base_n == 1]
    assert ov.GROWTH == pytest.approx(statistics.median(published.fit_growth(t) for t in one_node), abs=0.01)
    points = [g for t in one_node for g in published.point_growths(t)]
    assert ov.GROWTH_RANGE[0] <= min(points) <= ov.GROWTH_RANGE[0] + 0.02
    assert ov.GROWTH_RANGE[1] >= max(points) >= ov.GROWTH_RANGE[1] - 0.02
    fractions = [published.fraction_at_two(t) for t in published.FRACTION_TABLES]
    assert ov.DEFAULT_FRACTION == pytest.approx(statistics.median(fractions), abs=0.005)
    assert ov.FRACTION_RANGE[0] <= min(fractions) <= ov.FRACTION_RANGE[0] + 0.01
    assert ov.FRACTION_RANGE[1] >= max(fractions) >= ov.FRACTION_RANGE[1] - 0.01


def test_step_exponent_is_the_fp32_against_mixed_precision_fit(published):
    import math

    exps = []
    for size in ("base", "large"):
        fp32, mixed = (published.calibration(published.BY_KEY[f"txl-{size}-{p}"]) for p in ("fp32", "mixed"))
        exps.append(math.log(fp32.at_two_s / mixed.at_two_s) / math.log(fp32.at_step_s / mixed.at_step_s))
    assert min(exps) <= ov.STEP_EXPONENT <= max(exps)
    assert ov.STEP_EXPONENT == pytest.approx(statistics.mean(exps), abs=0.05)
