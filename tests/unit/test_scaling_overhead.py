"""The distributed-overhead term: its arithmetic, its calibration, where plan --explain finds it."""

from __future__ import annotations

import json
import math

import pytest

from scaletrain.cli.main import main
from hypothesis import given, settings
from hypothesis import strategies as st

from scaletrain.observe.overhead import (CALIBRATION_SPREAD, DEFAULT_FRACTION, FRACTION_RANGE, GROWTH, GROWTH_RANGE,
                                         NONE, STEP_EXPONENT, Overhead, calibrate, calibration_path,
                                         load_calibration, save_calibration)
from scaletrain.observe.scaling import Links, StepProfile, efficiency_text, predict, recommend

NVSWITCH = Links(intra_gbs=120.0, inter_gbs=80.0, devices_per_node=8)


def test_overhead_shape_zero_at_one_then_log2_growth():
    cal = Overhead(at_two_s=0.01, spread=0.0)
    assert cal.seconds(1.0, 1) == 0.0
    assert cal.seconds(1.0, 2) == pytest.approx(0.01)
    assert cal.seconds(1.0, 16) == pytest.approx(0.01 * (1 + GROWTH * 3))
    assert cal.seconds(1.0, 16, "high") == pytest.approx(0.01 * (1 + GROWTH_RANGE[1] * 3))
    default = Overhead()
    assert not default.calibrated and cal.calibrated
    # the default: DEFAULT_FRACTION of a 100 ms step, carried as step ** 0.5: a 400 ms step pays twice the seconds
    assert default.seconds(0.1, 2) == pytest.approx(0.1 * DEFAULT_FRACTION)
    assert default.seconds(0.4, 2) == pytest.approx(0.1 * DEFAULT_FRACTION * 2)
    assert default.seconds(0.4, 4, "low") == pytest.approx(0.1 * FRACTION_RANGE[0] * 2 * (1 + GROWTH_RANGE[0]))
    with pytest.raises(ValueError):
        cal.seconds(1.0, 2, "middle")


def test_a_calibrated_range_is_never_zero_wide():
    """A calibration that measured no overhead at all printed "99% (99-99%)": the range now keeps the
    calibration's own spread (CALIBRATION_SPREAD of each GPU's step), never zero."""
    step = StepProfile(compute_s=0.2, grad_bytes=10**6)
    zero = Overhead(at_two_s=0.0, at_step_s=0.2)
    assert zero.seconds(0.2, 2, "high") == pytest.approx(CALIBRATION_SPREAD * 0.2)
    for n in (2, 8, 64):
        p = predict(step, NVSWITCH, n, overhead=zero)
        assert p.efficiency_low < p.efficiency_high
        assert p.efficiency_low == pytest.approx(0.2 / (0.2 + CALIBRATION_SPREAD * 0.2 * (1 + GROWTH_RANGE[1]
                                                                                         * math.log2(n / 2))))
    low, high = efficiency_text(predict(step, NVSWITCH, 8, overhead=zero)).split("(")[1].rstrip("%)").split("-")
    assert int(low) < int(high)


def test_a_hidden_allreduce_is_not_a_free_step():
    """The old model: 100% and 'none (compute-bound)' at 8 GPUs on NVSwitch. Not any more."""
    step = StepProfile(compute_s=0.2, grad_bytes=100 * 10**6)
    p = predict(step, NVSWITCH, 8)
    assert p.exposed_comm_s == 0.0                      # the all-reduce is hidden behind the backward
    at_two = 0.1 * DEFAULT_FRACTION * 2 ** STEP_EXPONENT    # 0.2 s is twice the 100 ms reference
    assert p.efficiency == pytest.approx(0.2 / (0.2 + at_two * (1 + GROWTH * 2)))
    assert p.efficiency_low < p.efficiency < p.efficiency_high < 1.0 and not p.calibrated
    assert p.limit.startswith("distributed overhead") and "compute-bound" not in p.limit
    assert "100%" not in efficiency_text(p) and efficiency_text(p).startswith(f"{round(p.efficiency * 100)}% (")
    # pure arithmetic (no overhead at all) is the one case without a range, and it still stops at 99%
    assert efficiency_text(predict(step, NVSWITCH, 8, overhead=NONE)) == "99% (99-99%)"
    assert efficiency_text(predict(step, NVSWITCH, 1)) == "100%"


def test_exposed_communication_and_the_overhead_are_counted_once():
    # 1 s of compute, 4 GB over 10 GB/s between nodes, no overlap: 2 * 7/8 * 0.4 s = 0.7 s exposed at 8;
    # the default overhead (0.146 * 0.1 * 10**0.5 * (1 + 0.28 * 2) = 72 ms) is inside it, not added to it
    step = StepProfile(compute_s=1.0, grad_bytes=4 * 10**9)
    links = Links(intra_gbs=100.0, inter_gbs=10.0, devices_per_node=4, latency_s=0.0, overlap=0.0)
    p = predict(step, links, 8)
    assert p.exposed_comm_s == pytest.approx(0.7) and p.step_s == pytest.approx(1.7)
    assert p.overhead_s == 0.0 and p.limit == "communication"
    # how much of it falls inside is not known: the pessimistic end counts both in full
    high = Overhead().seconds(1.0, 8, "high")
    assert p.efficiency_low == pytest.approx(1.0 / (1.7 + high)) and p.efficiency_low < p.efficiency
    # a calibration counts it once too: what the run took beyond compute is the overhead
    cal = calibrate(1.8, 1.7, 8, step_s=1.0, source="x", exposed_s=0.7)
    assert cal.at_two_s == pytest.approx(0.8 / (1 + GROWTH * 2))
    assert predict(step, links, 8, overhead=cal).step_s == pytest.approx(1.8)


@given(compute=st.floats(1e-3, 100.0), wait=st.floats(0.0, 10.0), grad=st.integers(0, 10**10),
       n=st.integers(2, 4096), ways=st.integers(1, 64), at_two=st.one_of(st.none(), st.floats(0.0, 1.0)))
@settings(max_examples=200, deadline=None)
def test_strong_and_weak_scaling_are_one_formula(compute, wait, grad, n, ways, at_two):
    """Splitting one batch ``ways`` ways is, for each GPU, the step of a batch ``ways`` times smaller:
    the overhead rides on each GPU's step as it is at N, never on the whole 1-GPU step."""
    links = Links(intra_gbs=120.0, inter_gbs=80.0, devices_per_node=8)
    cal = Overhead() if at_two is None else Overhead(at_two_s=at_two, at_step_s=compute)
    strong = predict(StepProfile(compute_s=compute, data_wait_s=wait, grad_bytes=grad), links, n,
                     share=1 / ways, overhead=cal)
    small = predict(StepProfile(compute_s=compute / ways, data_wait_s=wait / ways, grad_bytes=grad), links, n,
                    overhead=cal)
    for field in ("step_s", "overhead_s", "exposed_comm_s"):
        assert getattr(strong, field) == pytest.approx(getattr(small, field), rel=1e-9, abs=1e-12)
    # efficiency against N times the whole batch on one GPU: the same throughput either way
    one = compute + wait
    assert strong.efficiency == pytest.approx((one / ways) / strong.step_s, rel=1e-9)


def test_calibration_from_a_measured_step():
    cal = calibrate(0.125, 0.11, 2, step_s=0.1, source="x")
    assert cal.at_two_s == pytest.approx(0.015) and cal.source == "x" and cal.at_step_s == 0.1
    assert calibrate(0.125, 0.11, 4, step_s=0.1, source="x").at_two_s == pytest.approx(0.015 / (1 + GROWTH))
    assert calibrate(0.10, 0.11, 2, step_s=0.1, source="x").at_two_s == 0.0    # faster than the model: noise
    with pytest.raises(ValueError):
        calibrate(0.1, 0.1, 1, step_s=0.1, source="x")
    # applied to a step 4x longer: x 4**0.5 = 2 in the middle, x1 (seconds as measured) to x4
    # (proportional), each end widened by the calibration's spread of the step
    assert cal.seconds(0.4, 2) == pytest.approx(0.015 * 4 ** STEP_EXPONENT)
    assert cal.seconds(0.4, 2, "low") == pytest.approx(0.015 - CALIBRATION_SPREAD * 0.4)
    assert cal.seconds(0.4, 2, "high") == pytest.approx(0.06 + CALIBRATION_SPREAD * 0.4)
    assert cal.seconds(0.1, 2, "low") == pytest.approx(0.015 - CALIBRATION_SPREAD * 0.1)
    step = StepProfile(compute_s=0.1, grad_bytes=0)
    # the recommendation takes the range's low end: at 4 GPUs 0.1 / (0.1 + 0.018 * (1 + 0.28)) = 81% in
    # the middle but 0.1 / (0.1 + (0.018 + 0.0015) * (1 + 0.51)) = 77% at the low end, so 2 GPUs it is
    preds = [predict(step, NVSWITCH, n, overhead=Overhead(at_two_s=0.018)) for n in (1, 2, 4, 8)]
    assert preds[2].efficiency == pytest.approx(0.1 / (0.1 + 0.018 * (1 + GROWTH)))
    assert preds[2].efficiency_low == pytest.approx(0.1 / (0.1 + (0.018 + CALIBRATION_SPREAD * 0.1)
                                                           * (1 + GROWTH_RANGE[1])))
    assert preds[2].efficiency >= 0.8 > preds[2].efficiency_low
    assert recommend(preds, threshold=0.8).n == 2


def test_calibrations_are_stored_per_cluster_and_survive_a_bad_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    path = calibration_path()
    assert path == tmp_path / "cfg" / "scaletrain" / "scaling-calibration.json"
    assert load_calibration("lumi") is None
    save_calibration("lumi", {"at_two_s": 0.004, "source": "bench scaling of cnn on 2 processes"})
    save_calibration("roihu", {"at_two_s": 0.002, "source": "r"})
    assert load_calibration("lumi").at_two_s == 0.004 and load_calibration("roihu").source == "r"
    assert sorted(json.loads(path.read_text())) == ["lumi", "roihu"]
    assert [p.name for p in path.parent.iterdir()] == [path.name]     # no temporary file left
    path.write_text("{not json")
    assert load_calibration("lumi") is None
    save_calibration("lumi", {"at_two_s": 0.003, "source": "again"})  # a damaged file is replaced
    assert load_calibration("lumi").at_two_s == 0.003
    path.write_text(json.dumps({"lumi": {"at_two_s": "fast"}, "x": {"at_two_s": math.inf}}))
    assert load_calibration("lumi") is None and load_calibration("x") is None


# the JSC course's 1-GPU ResNet-50 step (342.2 min / 50045 steps), as test_bench_explain uses it
JSC = {"step_s_median": 342.2 * 60 / 50045, "samples_per_step": 256, "data_wait_frac": 0.0,
       "grad_bytes": 25_557_032 * 4, "total_samples": 50045 * 256, "world_size": 1, "steps": 50045}
PLAN = ["plan", "--cluster", "juwels-booster", "--gpus", "16", "--account", "p", "--time", "01:00:00"]


def test_plan_explain_says_uncalibrated_then_uses_the_stored_calibration(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    (tmp_path / "summary.json").write_text(json.dumps(JSC))
    assert main([*PLAN, "--explain", str(tmp_path), "--", "train.py"]) == 0
    err = capsys.readouterr().err
    assert "NOT calibrated" in err and "bench scaling --nproc 1,2 --cluster juwels-booster" in err
    assert "compute-bound)  <- requested" not in err and " 100% (" not in err
    # a 2-process run on a Booster node measured 20 ms of overhead per step
    save_calibration("juwels-booster", {"at_two_s": 0.02, "source": "bench scaling of resnet on 2 processes"})
    assert main([*PLAN, "--explain", str(tmp_path), "--", "train.py"]) == 0
    err = capsys.readouterr().err
    assert "calibrated, 20.0 ms per step at 2 GPUs (bench scaling of resnet on 2 processes)" in err
    step = JSC["step_s_median"]
    p16 = predict(StepProfile(compute_s=step, grad_bytes=JSC["grad_bytes"], samples_per_step=256),
                  _booster(), 16, overhead=Overhead(at_two_s=0.02))
    assert f"{p16.step_s * 1000:.1f}" in err and efficiency_text(p16) in err
    # measured with a 4x shorter step (the bench's small workload): carried over as 4**0.5
    save_calibration("juwels-booster", {"at_two_s": 0.02, "at_step_s": step / 4, "source": "bench scaling of cnn"})
    assert main([*PLAN, "--explain", str(tmp_path), "--", "train.py"]) == 0
    err = capsys.readouterr().err
    assert "calibrated, 40.0 ms per step at 2 GPUs (bench scaling of cnn; measured 20.0 ms with a 102.6 ms step" in err
    # another cluster's calibration is not this one's
    save_calibration("juwels-booster", {"at_two_s": 0.02, "source": "s"})
    assert main(["plan", "--cluster", "jupiter", "--gpus", "4", "--account", "p", "--explain", str(tmp_path),
                 "--", "train.py"]) == 0
    assert "NOT calibrated" in capsys.readouterr().err


def test_plan_explain_uses_the_calibration_inside_a_scaling_json_of_the_same_cluster(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    row = {"step_s": 0.05, "data_wait_frac": 0.0, "grad_bytes": 1000, "batch_per_device": 8, "steps": 20,
           "workload": "cnn"}
    doc = {"kind": "scaling", "rows": [dict(row, nproc=1), dict(row, nproc=2, step_s=0.06)],
           "calibration": {"cluster": "juwels-booster", "at_two_s": 0.01, "source": "bench scaling, 2 processes"}}
    (tmp_path / "scaling.json").write_text(json.dumps(doc))
    assert main([*PLAN, "--explain", str(tmp_path / "scaling.json"), "--", "train.py"]) == 0
    assert "calibrated, 10.0 ms per step at 2 GPUs (bench scaling, 2 processes)" in capsys.readouterr().err
    doc["calibration"]["cluster"] = "local"                 # measured elsewhere: not used here
    (tmp_path / "scaling.json").write_text(json.dumps(doc))
    assert main([*PLAN, "--explain", str(tmp_path / "scaling.json"), "--", "train.py"]) == 0
    assert "NOT calibrated" in capsys.readouterr().err


def _booster() -> Links:
    from scaletrain.clusters.profile import load_profile
    from scaletrain.observe.scaling import links_from_profile

    return links_from_profile(load_profile("juwels-booster"))
