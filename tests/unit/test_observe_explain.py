"""plan --explain: measured runs in, GPU-count advice out."""

from __future__ import annotations

import json

import pytest

from scaletrain.cli.main import main
from scaletrain.errors import UsageError
from scaletrain.observe.explain import explain, load_measurement
from scaletrain.observe.scaling import Links, StepProfile

# The JSC course's 1-GPU ResNet-50 run: 10 ImageNet epochs, batch 256, 342 min
JSC = {"step_s_median": 342.2 * 60 / 50045, "samples_per_step": 256, "data_wait_frac": 0.0,
       "grad_bytes": 25_557_032 * 4, "total_samples": 50045 * 256, "world_size": 1, "steps": 50045}


def test_load_monitor_summary_and_scaling_json(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({**JSC, "data_wait_frac": 0.25}))
    step, work, source = load_measurement(str(tmp_path))
    assert step.compute_s == pytest.approx(JSC["step_s_median"] * 0.75)
    assert step.data_wait_s == pytest.approx(JSC["step_s_median"] * 0.25)
    assert step.grad_bytes == JSC["grad_bytes"] and step.samples_per_step == 256
    assert work == 50045 * 256 and "summary.json" in source
    scaling = {"kind": "scaling", "rows": [
        {"nproc": 1, "step_s": 0.05, "data_wait_frac": 0.0, "grad_bytes": 1000, "batch_per_device": 8,
         "steps": 20, "workload": "cnn"},
        {"nproc": 2, "step_s": 0.07, "data_wait_frac": 0.0, "grad_bytes": 1000, "batch_per_device": 8,
         "steps": 20, "workload": "cnn"}]}
    (tmp_path / "scaling.json").write_text(json.dumps(scaling))
    step, work, _ = load_measurement(str(tmp_path / "scaling.json"))
    assert (step.compute_s, step.grad_bytes, work) == (0.05, 1000, 160)


def test_missing_gradient_size_needs_params(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({**JSC, "grad_bytes": None}))
    with pytest.raises(UsageError) as err:
        load_measurement(str(path))
    assert "monitor.watch(model)" in err.value.hint and "--params" in err.value.hint
    assert load_measurement(str(path), params=1e6)[0].grad_bytes == 4_000_000
    with pytest.raises(UsageError):
        load_measurement(str(tmp_path / "nope"))


def test_recommendation_stops_where_communication_limits():
    # 1 s of compute, 4 GB of gradients, 100 GB/s in a node, 10 GB/s between nodes, no overlap
    step = StepProfile(compute_s=1.0, grad_bytes=4 * 10**9, samples_per_step=1)
    links = Links(intra_gbs=100.0, inter_gbs=10.0, devices_per_node=4, latency_s=0.0, overlap=0.0)
    text = explain(step, links, requested=8, work_samples=1000, time_limit_s=3600, cluster="c", source="s")
    # 4 GPUs: 2*3/4*4e9/100e9 = 0.06 s + the uncalibrated overhead 0.067*(1+0.28) = 0.0858 s -> 87%,
    # 81% at the range's low end (0.12*(1+0.46) = 0.175 s); 8 GPUs (2 nodes): 2*7/8*0.4 = 0.7 s
    # + 0.067*(1+0.28*2) = 0.1045 s -> 55%, range 0.12*(1+0.46*2) = 0.230 s -> 52% to
    # 0.03*(1+0.22*2) = 0.043 s -> 57%
    assert "recommendation: 4 GPU(s) on 1 node(s)" in text
    assert "beyond it communication limits it (8 GPUs: 55% (52-57%))" in text
    assert "87% (81-91%)" in text and "NOT calibrated" in text and "bench scaling --nproc 1,2 --cluster c" in text
    assert "<- requested" in text and "does NOT fit in" not in text


def test_plan_explain_end_to_end(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(JSC))
    rc = main(["plan", "--cluster", "juwels-booster", "--gpus", "16", "--account", "p", "--time", "00:10:00",
               "--explain", str(run), "--", "train.py"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.startswith("#!")
    assert "scaletrain plan --explain" in err and "102.2 MB of gradients" in err
    assert "5:42:12" in err  # 1 GPU: the measured 342.2 minutes
    assert "does NOT fit in the time limit 0:10:00" in err
    rc = main(["plan", "--cluster", "juwels-booster", "--gpus", "4", "--account", "p", "--json",
               "--explain", str(run), "--", "train.py"])
    assert rc == 0 and "recommendation" in json.loads(capsys.readouterr().out)["explain"]


@pytest.mark.parametrize("cluster, unit, per_device_hour", [
    ("lumi", "GPU-h", 0.5),       # one billed GPU-hour is two GCDs (LUMI's billing page)
    ("roihu", "GPU BU", 200.0),   # 200 BU per GPU-hour (CSC's billing page)
    ("fir", "bundle-h", 1.0),     # the Alliance counts bundles of one GPU with its cores and memory
])
def test_the_billed_column_is_in_the_centres_unit(cluster, unit, per_device_hour):
    from scaletrain.clusters.profile import load_profile
    from scaletrain.clusters.resources import billed_amount

    profile = load_profile(cluster)
    step = StepProfile(compute_s=1.0, grad_bytes=0, samples_per_step=1)
    links = Links(intra_gbs=100.0, inter_gbs=None, devices_per_node=1, latency_s=0.0, overlap=0.0)
    # 1 device, 3600 samples of 1 s: one device-hour
    text = explain(step, links, requested=1, work_samples=3600, max_gpus=1, cluster=cluster, source="s",
                   bill=lambda hours: billed_amount(hours, profile))
    header = next(line for line in text.splitlines() if "ms/step" in line)
    row = next(line for line in text.splitlines() if line.split()[:2] == ["1", "1"])
    assert f"billed ({unit})" in header
    assert row.split()[5] == f"{per_device_hour:.1f}", row
