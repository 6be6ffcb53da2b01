"""The model benchmark (benchmarks/llama.py, issue 30) at toy size on the CPU, so it cannot rot:
the shape's parameter and FLOP accounting against what torch counts, torchtitan's config and
log, and one end-to-end run of every variant (no timings asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.torch_features import fsdp_on_cpu

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import llama_model  # noqa: E402
import llama_titan  # noqa: E402


@pytest.mark.parametrize("size", ["toy", "1b"])
def test_parameter_count_from_the_shape_is_the_models(size):
    cfg = llama_model.SIZES[size]
    model = llama_model.build(cfg, 16, device="meta")  # 1b: no memory spent
    total, body = cfg.parameters()
    assert total == sum(p.numel() for p in model.parameters())
    assert total - body == model.tok_embeddings.weight.numel()
    if size == "1b":  # the Llama 3.2 1B shape: 1.24e9 outside the (untied) embedding
        assert body == 1_235_814_400


def test_flops_per_token_matches_torchs_count_of_a_training_step():
    """6N + 12 L H Dh T against FlopCounterMode over one forward and backward (norm weights
    are in N but multiply nothing: 0.3% here)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    cfg, seq, batch = llama_model.SIZES["toy"], 32, 2
    model = llama_model.build(cfg, seq)
    counter = FlopCounterMode(display=False)
    # the math kernel: its matrix products are counted (the CPU's fused kernel is not)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(torch.randint(0, cfg.vocab, (batch, seq))).float().sum().backward()
    counted = counter.get_total_flops() / (batch * seq)
    assert llama_model.flops_per_token(cfg, seq) == pytest.approx(counted, rel=0.01)
    # the attention term matters: without it the formula is off by more than the tolerance
    assert 6 * cfg.parameters()[1] != pytest.approx(counted, rel=0.01)


def test_torchtitan_config_and_log():
    cfg = llama_model.SIZES["1b"]
    args = llama_titan.model_args(cfg)
    hidden = int(args["ffn_dim_multiplier"] * int(2 * 4 * cfg.dim / 3))  # torchtitan's rule
    hidden = args["multiple_of"] * ((hidden + args["multiple_of"] - 1) // args["multiple_of"])
    assert hidden == cfg.ffn and args["n_kv_heads"] == 8 and args["vocab_size"] == 128256
    toml = llama_titan.job_config(cfg, 2048, 4, compiled=True, ac=False, steps=13, dump=Path("/d"))
    for line in ("local_batch_size = 4", "seq_len = 2048", "steps = 13", "enable = true",
                 'mode = "none"', f'flavor = "{llama_titan.FLAVOR}"'):
        assert line in toml
    log = "\n".join(f"step: {i}  loss: 9.1  memory: {20 + i}.50GiB(30.1%)  tps: {t:,}  mfu: 40%"
                    for i, t in enumerate([100, 5000, 7000, 6000, 8000], 1))
    assert llama_titan.parse_log(log, warmup=1) == {"tokens_s_per_rank": 6500.0, "peak_gib": 25.5}
    assert llama_titan.parse_log(log, warmup=5) == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run the benchmark itself")
@pytest.mark.skipif(not fsdp_on_cpu(), reason="the hand-written loop and zero3 are FSDP2, which runs "
                    "on the CPU from torch 2.7")
def test_toy_run_end_to_end_on_the_cpu(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(REPO / "benchmarks" / "llama.py"), "--device", "cpu", "--ac", "both",
           "--repeats", "2", "--steps", "1", "--warmup", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "llama.json").read_text())
    assert doc["size"] == "toy" and doc["world"] == 1
    rows = {(r["variant"], r["ac"]): r for r in doc["rows"]}
    assert set(rows) == {(v, ac) for v in ("hand", "zero3", "ddp", "titan") for ac in (False, True)}
    for variant in ("hand", "zero3", "ddp"):
        for ac in (False, True):
            row = rows[variant, ac]
            assert row["status"] == "ok" and row["rounds"] == 2 and row["batch"] == 2
            assert row["tokens_s_min"] <= row["tokens_s"] <= row["tokens_s_max"] and row["tokens_s"] > 0
            fpt = llama_model.flops_per_token(llama_model.SIZES["toy"], 64)
            assert row["tflops"] == pytest.approx(row["tokens_s"] * fpt / 1e12, rel=0.01)
    assert rows["hand", False]["vs_hand"] == 1.0
    assert "GPU" in rows["titan", False]["status"] or "not installed" in rows["titan", False]["status"]
    table = (tmp_path / "llama.md").read_text()
    assert table.count("\n| hand | 64 |") == 2 and "torchtitan" in table


def test_torchtitan_worker_registers_the_shape_and_runs_its_trainer(tmp_path):
    """The worker against a stand-in torchtitan (the real one is not installed here): the flavor
    table gains the benchmark's shape (fields it lacks dropped), the trainer gets the arguments."""
    pkg = tmp_path / "torchtitan" / "models" / "llama3"
    pkg.mkdir(parents=True)
    (tmp_path / "torchtitan" / "__init__.py").write_text("")
    (tmp_path / "torchtitan" / "models" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(
        "import dataclasses\n"
        "@dataclasses.dataclass\n"
        "class TransformerModelArgs:\n"
        "    dim: int = 1\n    n_layers: int = 1\n    n_heads: int = 1\n    n_kv_heads: int = 1\n"
        "    vocab_size: int = 1\n    rope_theta: float = 1.0\n    ffn_dim_multiplier: float = 1.0\n"
        "    multiple_of: int = 1\n"
        "llama3_args = {'8B': TransformerModelArgs()}\n")
    (tmp_path / "torchtitan" / "train.py").write_text(
        "import sys\nfrom torchtitan.models.llama3 import llama3_args\n"
        "a = llama3_args['scaletrain_bench']\n"
        "print(f'argv={sys.argv[1:]} dim={a.dim} layers={a.n_layers} kv={a.n_kv_heads}')\n")
    args = repr(llama_titan.model_args(llama_model.SIZES["1b"]))
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "llama_titan.py"), "--worker", args,
                           "--job.config_file", "x.toml"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "argv=['--job.config_file', 'x.toml'] dim=2048 layers=16 kv=8"
