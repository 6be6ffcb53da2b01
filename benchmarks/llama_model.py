"""The Llama-style decoder the model benchmark trains (benchmarks/llama.py), defined here so the
benchmark needs nothing beyond torch: RMSNorm, rotary position embeddings, SwiGLU feed-forward,
grouped-query attention (fewer key/value heads than query heads), untied input and output
embeddings - the shape of torchtitan's llama3 model.

Sizes (``SIZES``):

- ``1b``: the Llama 3.2 1B shape (dim 2048, 16 layers, 32 query heads, 8 key/value heads,
  feed-forward 8192, vocabulary 128256): 1.50e9 parameters with untied embeddings, 1.24e9 of
  them outside the embedding table;
- ``toy``: the same architecture at dim 64, 2 layers, for CPU runs and tests.

FLOPs per token (:func:`flops_per_token`), the accounting torchtitan and the PaLM paper use, so
MFU figures compare: ``6 * N + 12 * L * H * Dh * T`` with ``N`` the parameters outside the
embedding table (a lookup multiplies nothing; the output projection does, so it counts), ``L``
layers, ``H`` query heads of ``Dh`` dimensions, ``T`` the sequence. ``6 N``: 2 FLOPs per weight
per token forward, 4 backward. The attention term: the score and weighted-sum products
(2 x 2 x T x H x Dh forward per token per layer, x3 with backward). Causal masking halves the
attention work a kernel really does; like torchtitan, we do not halve it (a stated convention,
not a measurement). Activation checkpointing recomputes the forward; that is not counted either
(MFU counts the model's FLOPs, not the hardware's).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """One decoder shape."""

    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        """Dimensions per attention head."""
        return self.dim // self.heads

    def parameters(self) -> tuple[int, int]:
        """(all parameters, those outside the embedding table), counted from the shape."""
        kv = self.kv_heads * self.head_dim
        attn = self.dim * self.dim * 2 + self.dim * kv * 2      # wq, wo; wk, wv
        block = attn + 3 * self.dim * self.ffn + 2 * self.dim   # SwiGLU's three; two norms
        embedding = self.vocab * self.dim
        body = self.layers * block + self.dim + self.vocab * self.dim  # final norm, output
        return embedding + body, body


SIZES: dict[str, LlamaConfig] = {
    "1b": LlamaConfig(dim=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256),
    "toy": LlamaConfig(dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=256),
}


def flops_per_token(cfg: LlamaConfig, seq: int) -> float:
    """Training FLOPs per token: ``6 N + 12 L H Dh T`` (see the module docstring)."""
    _, body = cfg.parameters()
    return 6.0 * body + 12.0 * cfg.layers * cfg.heads * cfg.head_dim * seq


def build(cfg: LlamaConfig, seq: int, *, device: Any = "cpu", seed: int = 0) -> Any:
    """A freshly initialised :class:`Llama` model (class made on first use: no torch at import)."""
    import torch

    torch.manual_seed(seed)
    with torch.device(device):
        return _classes()["Llama"](cfg, seq)


def block_class() -> type:
    """The transformer block's class (what FSDP shards and compiles one by one)."""
    return _classes()["Block"]


_CACHE: dict[str, type] = {}


def _classes() -> dict[str, type]:
    if _CACHE:
        return _CACHE
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    def rotate(x: Any, cos: Any, sin: Any) -> Any:
        # the rotation of pairs (x1, x2) by each position's angle, in real arithmetic
        x1, x2 = x[..., ::2], x[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return out.flatten(-2).type_as(x)

    class Attention(nn.Module):
        def __init__(self, cfg: LlamaConfig) -> None:
            super().__init__()
            self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
            self.wq = nn.Linear(cfg.dim, cfg.heads * cfg.head_dim, bias=False)
            self.wk = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
            self.wv = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
            self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.dim, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any) -> Any:
            b, t, _ = x.shape
            q = self.wq(x).view(b, t, self.heads, self.head_dim)
            k = self.wk(x).view(b, t, self.kv_heads, self.head_dim)
            v = self.wv(x).view(b, t, self.kv_heads, self.head_dim)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            # grouped-query attention: each key/value head serves heads // kv_heads query heads
            repeat = self.heads // self.kv_heads
            k = k.repeat_interleave(repeat, dim=2)
            v = v.repeat_interleave(repeat, dim=2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            return self.wo(y.transpose(1, 2).reshape(b, t, -1))

    class FeedForward(nn.Module):
        def __init__(self, cfg: LlamaConfig) -> None:
            super().__init__()
            self.w1 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
            self.w2 = nn.Linear(cfg.ffn, cfg.dim, bias=False)
            self.w3 = nn.Linear(cfg.dim, cfg.ffn, bias=False)

        def forward(self, x: Any) -> Any:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU

    class Block(nn.Module):
        def __init__(self, cfg: LlamaConfig) -> None:
            super().__init__()
            self.attention_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
            self.attention = Attention(cfg)
            self.ffn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
            self.feed_forward = FeedForward(cfg)

        def forward(self, x: Any, cos: Any, sin: Any, checkpointed: bool = False) -> Any:
            if checkpointed:
                # recompute the block's own arithmetic only, with FSDP2's hooks (which gather
                # and free its parameters) outside: checkpointing the FSDP2 module itself fails
                # its recomputation on torch 2.7.1-2.12.1 ("CheckpointError: Recomputed values
                # ... have different metadata"), as torchtitan's wrapping order avoids
                return checkpoint(self.body, x, cos, sin, use_reentrant=False)
            return self.body(x, cos, sin)

        def body(self, x: Any, cos: Any, sin: Any) -> Any:
            x = x + self.attention(self.attention_norm(x), cos, sin)
            return x + self.feed_forward(self.ffn_norm(x))

    class Llama(nn.Module):
        def __init__(self, cfg: LlamaConfig, seq: int) -> None:
            super().__init__()
            self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
            self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
            self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
            self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
            # activation checkpointing per block: keep each block's input, recompute the rest
            self.checkpointing = False
            half = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim
            angles = torch.outer(torch.arange(seq, dtype=torch.float32), cfg.rope_theta ** -half)
            # buffers, not parameters: not trained, not saved (persistent=False)
            self.register_buffer("cos", angles.cos()[None, :, None, :], persistent=False)
            self.register_buffer("sin", angles.sin()[None, :, None, :], persistent=False)
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)

        def forward(self, tokens: Any) -> Any:
            t = tokens.shape[1]
            cos, sin = self.cos[:, :t], self.sin[:, :t]
            h = self.tok_embeddings(tokens)
            recompute = self.checkpointing and torch.is_grad_enabled()
            for layer in self.layers:
                h = layer(h, cos, sin, checkpointed=recompute)
            return self.output(self.norm(h))

    _CACHE.update(Llama=Llama, Block=Block)
    return _CACHE
