"""plan --explain: measured runs in, GPU-count advice out."""

from __future__ import annotations

import json

import pytest

from scaletrain.cli.main import main
from scaletrain.errors import UsageError
from scaletrain.bench.explain import explain, load_measurement
from scaletrain.observe.scaling import Links, StepProfile

# The JSC course's 1-GPU ResNet-50 run: 10 ImageNet epochs, batch 256, 342 min
JSC = {"step_s_median": 342.2 * 60 / 50045, "samples_per_step": 256, "data_wait_frac": 0.0,
       "grad_bytes": 25_557_032 * 4, "total_samples": 50045 * 256, "world_size": 1, "steps": 50045}


def test_load_monitor_summary_and_scaling_json(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({**JSC, "data_wait_frac": 0.25, "device": "cuda:0"}))
    m = load_measurement(str(tmp_path))
    assert m.step.compute_s == pytest.approx(JSC["step_s_median"] * 0.75)
    assert m.step.data_wait_s == pytest.approx(JSC["step_s_median"] * 0.25)
    assert m.step.grad_bytes == JSC["grad_bytes"] and m.step.samples_per_step == 256
    assert m.work == 50045 * 256 and "summary.json" in m.source and m.device == "cuda:0" and not m.on_cpu
    (tmp_path / "scaling.json").write_text(json.dumps(SCALING))
    m = load_measurement(str(tmp_path / "scaling.json"))
    assert (m.step.compute_s, m.step.grad_bytes, m.work, m.device) == (0.05, 1000, 160, "cpu") and m.on_cpu


SCALING = {"kind": "scaling", "rows": [
    {"nproc": 1, "step_s": 0.05, "data_wait_frac": 0.0, "grad_bytes": 1000, "batch_per_device": 8,
     "steps": 20, "workload": "cnn", "device": "cpu"},
    {"nproc": 2, "step_s": 0.07, "data_wait_frac": 0.0, "grad_bytes": 1000, "batch_per_device": 8,
     "steps": 20, "workload": "cnn", "device": "cpu"}]}
PLAN = ["plan", "--cluster", "jupiter", "--gpus", "8", "--account", "p", "--time", "01:00:00"]


@pytest.mark.parametrize("damage, says", [
    (lambda d: d["rows"][0].pop("step_s"), "'step_s' is missing"),
    (lambda d: d["rows"][0].pop("batch_per_device"), "'batch_per_device' is missing"),
    (lambda d: d["rows"].insert(0, "not a row"), "row 1 is not an object"),
    (lambda d: d["rows"].insert(1, [1, 2]), "row 2 is not an object"),
    (lambda d: d.update(rows={"nproc": 1}), '"rows" is not a list'),
    (lambda d: d.pop("rows"), '"rows" is not a list'),
    (lambda d: d["rows"][0].update(data_wait_frac="half"), "'data_wait_frac' is missing or not a number"),
    (lambda d: d["rows"][0].update(grad_bytes=-5), "'grad_bytes' is not a byte count"),
])
def test_a_damaged_scaling_json_is_one_line_not_a_traceback(tmp_path, capsys, damage, says):
    """39e04f3 read scaling.json raw: a missing key, a row that is not an object or rows that are
    not a list ended in KeyError / AttributeError / TypeError."""
    doc = json.loads(json.dumps(SCALING))
    damage(doc)
    (tmp_path / "scaling.json").write_text(json.dumps(doc))
    rc = main([*PLAN, "--explain", str(tmp_path / "scaling.json"), "--", "train.py"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "Traceback" not in err
    first = err.strip().splitlines()[0]
    assert "is not a scaling report as bench scaling writes it" in first and says in first, err
    assert "bench scaling" in err.strip().splitlines()[-1]      # the hint


def test_a_run_folder_is_taken_as_report_takes_it(tmp_path, capsys):
    """'plan --explain runs/demo' said "not a regular file" where 'report runs/demo' reads the folder:
    the Monitor's summary.json is found where report finds its files (here runs/demo/monitor/)."""
    run = tmp_path / "runs" / "demo"
    (run / "monitor").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / "monitor" / "summary.json").write_text(json.dumps({**JSC, "device": "cuda:0"}))
    assert main([*PLAN, "--explain", str(run), "--", "train.py"]) == 0
    err = capsys.readouterr().err
    assert "not a regular file" not in err and f"{run / 'monitor' / 'summary.json'}" in err
    assert "recommendation: " in err
    # a run that never closed its Monitor: said so, with what to do
    (run / "monitor" / "summary.json").unlink()
    (run / "monitor" / "metrics.jsonl").write_text("")
    assert main([*PLAN, "--explain", str(run), "--", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "no summary.json" in err and "monitor.close()" in err and "Traceback" not in err
    (run / "monitor" / "metrics.jsonl").unlink()
    assert main([*PLAN, "--explain", str(run), "--", "train.py"]) == 2
    assert "holds no summary.json or scaling.json" in capsys.readouterr().err


@pytest.mark.parametrize("source", ["summary", "scaling"])
def test_a_cpu_measurement_is_said_to_be_one_and_gets_no_gpu_recommendation(tmp_path, capsys, source):
    """A CPU run explained on JUPITER's GH200 nodes recommended 8 GPUs without a word."""
    if source == "summary":
        (tmp_path / "summary.json").write_text(json.dumps({**JSC, "device": "cpu"}))
    else:
        (tmp_path / "scaling.json").write_text(json.dumps(SCALING))
    assert main([*PLAN, "--explain", str(tmp_path), "--", "train.py"]) == 0
    err = capsys.readouterr().err
    assert "NOTE: this step was measured on the CPU (cpu)" in err and "optimistic" in err
    rec = next(line for line in err.splitlines() if "recommendation:" in line)
    assert rec.strip().startswith("recommendation: none from a CPU measurement")
    assert "measure one GPU on jupiter first" in rec and "--cluster jupiter" in rec
    # the same step measured on a GPU is advice again
    (tmp_path / "summary.json").write_text(json.dumps({**JSC, "device": "cuda:0"}))
    (tmp_path / "scaling.json").unlink(missing_ok=True)
    assert main([*PLAN, "--explain", str(tmp_path), "--", "train.py"]) == 0
    err = capsys.readouterr().err
    assert "NOTE" not in err and "recommendation: none" not in err and "recommendation: " in err


def test_missing_gradient_size_needs_params(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({**JSC, "grad_bytes": None}))
    with pytest.raises(UsageError) as err:
        load_measurement(str(path))
    assert "monitor.watch(model)" in err.value.hint and "--params" in err.value.hint
    assert load_measurement(str(path), params=1e6).step.grad_bytes == 4_000_000
    with pytest.raises(UsageError):
        load_measurement(str(tmp_path / "nope"))


def test_recommendation_stops_where_communication_limits():
    # 1 s of compute, 4 GB of gradients, 100 GB/s in a node, 10 GB/s between nodes, no overlap.
    # Uncalibrated overhead at 2 GPUs: 14.6% of a 100 ms step x (1 s / 0.1 s)**0.5 = 46.2 ms.
    # 4 GPUs: 2*3/4*4e9/100e9 = 60 ms exposed, the overhead 46.2 * 1.28 = 59.1 ms inside it -> 1.06 s,
    # 94%; its pessimistic end adds 18.8% x 3.162 x 0.1 x 1.51 = 89.8 ms in full -> 1.150 s, 87%.
    # 8 GPUs (2 nodes): 2*7/8*0.4 = 700 ms exposed -> 1.7 s, 59%; low end 1.7 + 18.8% x 0.3162 x 2.02
    # = 1.820 s -> 55%
    step = StepProfile(compute_s=1.0, grad_bytes=4 * 10**9, samples_per_step=1)
    links = Links(intra_gbs=100.0, inter_gbs=10.0, devices_per_node=4, latency_s=0.0, overlap=0.0)
    text = explain(step, links, requested=8, work_samples=1000, time_limit_s=3600, cluster="c", source="s")
    assert "recommendation: 4 GPU(s) on 1 node(s)" in text
    assert "beyond it communication limits it (8 GPUs: 59% (55-59%))" in text
    assert "94% (87-94%)" in text and "NOT calibrated" in text and "bench scaling --nproc 1,2 --cluster c" in text
    assert "<- requested" in text and "does NOT fit in" not in text
    assert "leave out start-up, per-epoch pauses" in text


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
    ("jupiter", "core-h", 72.0),  # JSC assigns quota in core-h: a GPU-hour at its Grace CPU's 72 cores
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
