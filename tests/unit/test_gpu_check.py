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

REPO = Path(__file__).resolve().parents[2]
GPU_STEPS = ["gpu tests", "setup vs loop", "mfu", "bench comm", "checkpoint", "device sampler", "doctor"]
# issue 30's benchmarks run at toy size on the CPU too (so they cannot rot)
CPU_STEPS = ["checkpoint vs dcp", "model vs torchtitan"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run scripts/gpu-check.sh itself")
def test_cpu_form_runs_end_to_end_and_skips_every_gpu_step(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "gpu"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "gpu_check.json").read_text())
    assert list(doc["steps"]) == ["environment", *GPU_STEPS, *CPU_STEPS]
    assert doc["steps"]["environment"]["status"] == "ok" and doc["device"] == "no GPU"
    assert doc["steps"]["environment"]["torch"] == torch.__version__
    for name in GPU_STEPS:
        assert (doc["steps"][name]["status"], doc["steps"][name]["reason"]) == ("skipped", "no GPU"), name
    ckpt, model = doc["steps"]["checkpoint vs dcp"], doc["steps"]["model vs torchtitan"]
    assert ckpt["status"] == model["status"] == "ok", (ckpt, model)
    assert [s["gib"] for s in ckpt["report"]["sizes"]] == [0.004, 0.016, 0.062]  # 0.3, 1, 4 GiB / 64
    assert all(ckpt[f"{g}GiB_floor_s"] > 0 for g in (0.004, 0.016, 0.062))
    assert model["hand_tokens_s"] > 0 and model["zero3_vs_hand"] > 0 and model["ddp_vs_hand"] > 0
    assert "GPU" in model["titan"] or "not installed" in model["titan"]
    table = (out / "gpu_check.md").read_text().splitlines()
    rows = [line for line in table if line.startswith("| ") and not line.startswith("| step")]
    assert len(rows) == 1 + len(GPU_STEPS) + len(CPU_STEPS)
    assert sum("| skipped: no GPU |" in row for row in rows) == len(GPU_STEPS)
