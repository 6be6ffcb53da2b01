"""The GPU acceptance command's CPU form (issue 23): `bash scripts/gpu-check.sh OUT` runs end to
end without a GPU, writes one JSON and one markdown table, and reports every GPU step as
"skipped: no GPU" (on a GPU machine the real run is the check, not this test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scaletrain.torch_features import fsdp_on_cpu

REPO = Path(__file__).resolve().parents[2]
GPU_STEPS = ["gpu tests", "gpu paths", "setup vs loop", "mfu", "bench comm", "checkpoint", "device sampler", "doctor"]
# issue 30's benchmarks run at toy size on the CPU too (so they cannot rot)
CPU_STEPS = ["checkpoint vs dcp", "model vs torchtitan"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run scripts/gpu-check.sh itself")
def test_cpu_form_runs_end_to_end_and_skips_every_gpu_step(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "gpu"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)  # a bound, not a timing: 300 s ran out on a loaded machine
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "gpu_check.json").read_text())
    assert list(doc["steps"]) == ["environment", *GPU_STEPS, *CPU_STEPS]
    assert doc["steps"]["environment"]["status"] == "ok" and doc["device"] == "no GPU"
    assert doc["steps"]["environment"]["torch"] == torch.__version__
    for name in GPU_STEPS:
        assert (doc["steps"][name]["status"], doc["steps"][name]["reason"]) == ("skipped", "no GPU"), name
    ckpt, model = doc["steps"]["checkpoint vs dcp"], doc["steps"]["model vs torchtitan"]
    if not fsdp_on_cpu():   # torch 2.6: the model step's FSDP2 loops cannot run on the CPU
        assert (model["status"], model["reason"]) == ("skipped", "FSDP2 on the CPU needs torch 2.7"), model
        model = {"status": "ok", "hand_tokens_s": 1, "zero3_vs_hand": 1, "ddp_vs_hand": 1, "titan": "GPU"}
    assert ckpt["status"] == model["status"] == "ok", (ckpt, model)
    assert [s["gib"] for s in ckpt["report"]["sizes"]] == [0.004, 0.016, 0.062]  # 0.3, 1, 4 GiB / 64
    assert all(ckpt[f"{g}GiB_floor_s"] > 0 for g in (0.004, 0.016, 0.062))
    assert model["hand_tokens_s"] > 0 and model["zero3_vs_hand"] > 0 and model["ddp_vs_hand"] > 0
    assert "GPU" in model["titan"] or "not installed" in model["titan"]
    table = (out / "gpu_check.md").read_text().splitlines()
    rows = [line for line in table if line.startswith("| ") and not line.startswith("| step")]
    assert len(rows) == 1 + len(GPU_STEPS) + len(CPU_STEPS)
    assert sum("| skipped: no GPU |" in row for row in rows) == len(GPU_STEPS)


def _module(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return mod


class _Card:
    """A fake clock where the block that runs first in a round takes 20% longer (a card whose
    clocks ramp up), and a variant may be slower by a factor of its own."""

    def __init__(self, names, factors):
        self.factors = factors
        self.since_round = 0
        self.n = len(names)

    def block(self, name):
        def run():
            first = self.since_round % self.n == 0
            self.since_round += 1
            return 0.010 * self.factors.get(name, 1.0) * (1.2 if first else 1.0)
        return run


def test_setup_vs_loop_ratio_is_interleaved_and_cancels_the_order():
    """The old step timed hand, ddp, zero3 once each in a fixed order: with a card that is slow
    for whatever runs first, ddp read 0.83x of the hand loop. Interleaved, ddp at the same speed
    reads 1.00 with the spread the order effect leaves, and a real 10% difference reads 1.10."""
    interleaved = _module("interleave").interleaved
    names = ["hand", "ddp", "zero3"]
    card = _Card(names, {"zero3": 1.1})
    out = interleaved({n: card.block(n) for n in names}, "hand")
    assert out["rounds"] == 7
    assert out["ddp_vs_hand"] == 1.0 and out["ddp_vs_hand_spread"] == 0.2
    assert out["zero3_vs_hand"] == 1.1
    assert out["hand_ms"] == 10.0


def test_gpu_paths_lists_each_test_with_its_outcome():
    junit = _module("gpu_check").junit_outcomes
    xml = ('<testsuites><testsuite><testcase classname="t" name="test_run"/>'
           '<testcase name="test_mps"><skipped message="needs nvidia-cuda-mps-control (CUDA MPS)"/></testcase>'
           '<testcase name="test_ckpt[True]"><failure message="assert False&#10;more">tb</failure></testcase>'
           '</testsuite></testsuites>')
    assert junit(xml) == {"test_run": "passed", "test_mps": "skipped: needs nvidia-cuda-mps-control (CUDA MPS)",
                          "test_ckpt[True]": "failed: assert False"}
