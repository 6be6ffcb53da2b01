"""A small GPT-style language model trained with every scaletrain strategy, one flag apart.

    python examples/strategies_gpt.py                                          # one process
    scaletrain run --nproc-per-node 2 examples/strategies_gpt.py --strategy zero3
    scaletrain run --nproc-per-node 4 examples/strategies_gpt.py --strategy hsdp --precision bf16
    scaletrain plan --cluster lumi --nodes 2 --account project_465000001 -- \\
        examples/strategies_gpt.py --strategy hsdp --precision bf16

The whole scaletrain API in one loop: ``init()`` (environment), ``setup()`` (strategy and
precision), ``loader()`` (sharding, automatic epochs, a global batch divided over the ranks),
``accumulate()`` + ``backward()`` (gradient accumulation and fp16 loss scaling on every
strategy), ``all_reduce_mean()`` (metrics) and ``scale_lr()``. The data is synthetic (no
downloads): token sequences from a fixed random bigram table, so the loss falls.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import scaletrain


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, ``layers`` blocks, a final norm and the output head."""

    def __init__(self, vocab: int, seq: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def bigram_corpus(samples: int, seq: int, vocab: int, seed: int) -> TensorDataset:
    """Sequences drawn from a fixed random bigram table: learnable, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    table = torch.softmax(torch.randn(vocab, vocab, generator=g) * 3, dim=1)
    tokens = torch.empty(samples, seq + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab, (samples,), generator=g)
    for t in range(seq):
        tokens[:, t + 1] = torch.multinomial(table[tokens[:, t]], 1, generator=g).squeeze(1)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default="ddp",
                   help="ddp, zero1, zero2, zero3, hsdp, offload, pipeline, none, auto")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"])
    p.add_argument("--global-batch", type=int, default=32, help="samples per optimizer step, all ranks")
    p.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--base-lr", type=float, default=1e-3, help="learning rate at a global batch of 32")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    env = scaletrain.init()
    torch.manual_seed(args.seed)  # every rank builds the same initial model
    model = GPT(args.vocab, args.seq, args.dim, heads=4, layers=args.layers)
    lr = scaletrain.scale_lr(args.base_lr, 32, args.global_batch, rule="sqrt")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    # min_params=0: shard every block of this small model (big models use the default threshold)
    options: dict = {"min_params": 0} if args.strategy in ("zero2", "zero3", "fsdp", "hsdp", "offload") else {}
    pipeline = args.strategy == "pipeline"
    if pipeline:  # the last stage computes the loss, so the pipeline gets it; the step runs the schedule
        if args.accum != 1:
            p.error("--strategy pipeline splits each batch into micro-batches itself: leave out --accum")
        stages = env.world_size
        if args.layers < stages:
            p.error(f"--strategy pipeline on {stages} ranks needs at least {stages} --layers (one stage each)")
        # one stage per rank, cut before evenly spaced blocks
        options = {"loss_fn": lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten()),
                   "split_points": [f"blocks.{i * args.layers // stages}" for i in range(1, stages)],
                   # the split traces the model with one batch of the shape step() gets (one replica)
                   "example_input": torch.zeros(args.global_batch, args.seq, dtype=torch.long)}
    model, optimizer = scaletrain.setup(model, optimizer, strategy=args.strategy,
                                        precision=args.precision, verbose=True, **options)

    micro_batch = args.global_batch // args.accum
    # the ranks of one pipeline read the same batches: shard over the replicas, not the ranks
    shard = {"rank": model.dp_rank, "world_size": model.dp_size} if pipeline else {}
    data = scaletrain.loader(bigram_corpus(args.samples, args.seq, args.vocab, args.seed),
                             global_batch_size=micro_batch, seed=args.seed, **shard)
    acc = None if pipeline else scaletrain.accumulate(model, steps=args.accum)
    scaletrain.print(f"{env.describe()}; strategy {args.strategy}, precision {args.precision}, "
                     f"global batch {args.global_batch} = {data.batch_size} x "
                     + (f"{model.dp_size} pipeline replica(s)" if pipeline else
                        f"{env.world_size} ranks x {args.accum} micro-steps") + f", lr {lr:.2e}")

    step, first_loss, t0 = 0, None, time.perf_counter()
    while step < args.steps:
        for x, y in data:  # a new pass starts a new epoch: the loader reshuffles by itself
            x, y = x.to(env.device), y.to(env.device)
            if pipeline:  # every rank calls step(); the loss comes back averaged on all of them
                mean = model.step(x, y, broadcast_loss=True)
            else:
                with acc:
                    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                    scaletrain.backward(loss)
                if not acc.sync:
                    continue
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                mean = scaletrain.all_reduce_mean(loss.detach())
            step += 1
            first_loss = float(mean) if first_loss is None else first_loss
            if step % 10 == 0 or step == args.steps:
                rate = step * args.global_batch / (time.perf_counter() - t0)
                scaletrain.print(f"step {step} loss {float(mean):.4f} samples/s {rate:.0f}")
            if step == args.steps:
                break
    scaletrain.print(f"done: loss {first_loss:.4f} -> {float(mean):.4f}")
    scaletrain.shutdown()


if __name__ == "__main__":
    main()
