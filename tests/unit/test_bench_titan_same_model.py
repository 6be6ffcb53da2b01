"""The torchtitan row compares like with like (issue 40 item 4): before torchtitan's trainer starts,
its model of the benchmark's flavor is built on the meta device and compared with the benchmark's own
model - parameter count and shapes - and a different model is refused with the difference. Tested
against a stand-in torchtitan package shaped like the real one (the real one is not installed here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import llama_model  # noqa: E402
import llama_titan  # noqa: E402

# a shape whose SwiGLU width torchtitan's rounding reproduces exactly (682 * 1.126... = 768, a multiple of 256)
CFG = llama_model.LlamaConfig(dim=256, layers=2, heads=4, kv_heads=2, ffn=768, vocab=512)

_MODEL = '''
import dataclasses
import torch
from torch import nn


@dataclasses.dataclass
class TransformerModelArgs:
    dim: int = 1
    n_layers: int = 1
    n_heads: int = 1
    n_kv_heads: int = 1
    VOCAB: int = 8
    rope_theta: float = 1.0
    ffn_dim_multiplier: float = 1.0
    multiple_of: int = 1
    norm_eps: float = 1e-5


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        hd = a.dim // a.n_heads
        self.wq, self.wk = nn.Linear(a.dim, a.n_heads * hd, bias=False), nn.Linear(a.dim, a.n_kv_heads * hd, bias=False)
        self.wv, self.wo = nn.Linear(a.dim, a.n_kv_heads * hd, bias=False), nn.Linear(a.n_heads * hd, a.dim, bias=False)
        hidden = int(a.ffn_dim_multiplier * int(2 * 4 * a.dim / 3))
        hidden = a.multiple_of * ((hidden + a.multiple_of - 1) // a.multiple_of)
        self.w1, self.w3 = nn.Linear(a.dim, hidden, bias=False), nn.Linear(a.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, a.dim, bias=False)
        self.attention_norm, self.ffn_norm = nn.RMSNorm(a.dim), nn.RMSNorm(a.dim)


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok_embeddings = nn.Embedding(a.VOCAB, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = nn.RMSNorm(a.dim)
        self.output = nn.Linear(a.dim, a.VOCAB, bias=False)


llama3_args = {"8B": TransformerModelArgs()}
'''


def _torchtitan(root: Path, vocab_field: str) -> Path:
    pkg = root / "torchtitan" / "models" / "llama3"
    pkg.mkdir(parents=True)
    (root / "torchtitan" / "__init__.py").write_text("")
    (root / "torchtitan" / "models" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(_MODEL.replace("VOCAB", vocab_field))
    (root / "torchtitan" / "train.py").write_text("import sys\nprint('trainer ran', sys.argv[1:])\n")
    return root


def _worker(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "llama_titan.py"), "--worker",
                           repr(llama_titan.model_args(CFG)), "--expect", repr(llama_titan.expected(CFG, 16)),
                           "--job.config_file", "x.toml"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})


def test_the_same_model_runs_the_trainer(tmp_path):
    proc = _worker(_torchtitan(tmp_path, "vocab_size"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "trainer ran ['--job.config_file', 'x.toml']"


def test_a_renamed_field_that_changes_the_model_is_refused_with_the_difference(tmp_path):
    proc = _worker(_torchtitan(tmp_path, "vocab_sz"))   # vocab_size unknown: left at its default, 8
    assert proc.returncode != 0 and "trainer ran" not in proc.stdout
    ours = CFG.parameters()[0]
    theirs = ours - 2 * (CFG.vocab - 8) * CFG.dim
    assert (f"torchtitan: not the benchmark's model, refused: torchtitan's model has {theirs:,} parameters, "
            f"the benchmark's {ours:,}; shapes only in torchtitan's: [8, 256] x2; "   # embedding and output
            "only in the benchmark's: [512, 256] x2") in proc.stderr


def test_difference_names_counts_and_shapes():
    ours = {"params": 10, "shapes": [(2, 3), (4,)]}
    assert llama_titan.difference(ours, dict(ours)) is None
    assert llama_titan.difference({"params": 12, "shapes": [(2, 3), (6,)]}, ours) == (
        "torchtitan's model has 12 parameters, the benchmark's 10; shapes only in torchtitan's: [6] x1; "
        "only in the benchmark's: [4] x1")
