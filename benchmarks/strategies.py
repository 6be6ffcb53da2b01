"""Benchmark: scaletrain.setup() strategies against a hand-written DDP loop (issue 4).

One run measures, on ``--nproc`` processes (default 2, CPU/gloo):

- the median step time of the CIFAR CNN under ``setup(strategy="ddp")`` and under a
  hand-written ``DistributedDataParallel`` loop (the overhead of scaletrain; target <= 1.02);
- ``zero3`` against ``ddp``: median step time and per-rank bytes of parameters, gradients and
  optimizer state (the tensors each rank holds after a step).

The variants run interleaved step by step (A B C, B C A, ...) so that load from other
processes hits them alike. The figures go to the "Strategies" section of docs/benchmarks.md (other
sections are left alone).

On a GPU machine::

    python benchmarks/strategies.py --device cuda --precision bf16 --nproc 2
    python benchmarks/strategies.py --device cuda --precision bf16 --gpt   # MFU, one GPU

``--gpt`` trains a small GPT-style model (``--gpt-layers``/``--gpt-dim``/``--gpt-seq``) on one GPU
under ``setup(strategy="none", precision=...)`` and reports the model FLOP utilisation:
``6 * params * tokens/s`` plus attention ``12 * layers * dim * seq`` per token (the PaLM
accounting), over the GPU's dense peak for that precision (``--peak-tflops`` overrides the table).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
SECTION = "## Strategies"

# dense bf16/fp16 tensor-core peaks in TFLOP/s (vendor data sheets, SXM/OAM parts)
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "V100": 125.0, "A40": 149.7,
               "L40S": 362.0, "MI250X": 191.5, "MI300X": 1307.0}


# ------------------------------------------------------------------------- models


def cnn():
    """The example's CIFAR-10 CNN (examples/cifar10_cnn.py), so the benchmark times what users run."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from cifar10_cnn import Net

    return Net()


def gpt(layers: int, dim: int, heads: int, seq: int, vocab: int):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
            self.head.weight = self.tok.weight  # tied, as in GPT-2

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return GPT()


# ------------------------------------------------------------------------- worker


def state_bytes(model, opt) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank holds (local shards)."""
    import torch
    from torch.distributed.tensor import DTensor

    def size(t) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = list(model.parameters())
    return {"params": sum(size(p) for p in params),
            "grads": sum(size(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(size(v) for s in opt.state.values() for v in s.values()
                             if isinstance(v, torch.Tensor) and v.ndim > 0)}


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    import scaletrain

    env = scaletrain.init(device=None if args.device == "auto" else args.device)
    device = torch.device(env.device)
    cuda = device.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)

    def make(variant: str):
        torch.manual_seed(0)
        model = cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if variant == "hand-ddp":  # what a user writes by hand, with torch only
            model = DistributedDataParallel(model.to(device),
                                            device_ids=[device.index] if cuda else None)
            return model, opt
        strategy = variant.split("-", 1)[1]
        return scaletrain.setup(model, opt, strategy=strategy, precision=args.precision,
                                min_params=1000)

    variants = ["hand-ddp", "setup-ddp", "setup-zero3"]
    built = {v: make(v) for v in variants}
    g = torch.Generator().manual_seed(env.rank)
    x = torch.randn(args.batch, 3, 32, 32, generator=g).to(device)
    y = torch.randint(0, 10, (args.batch,), generator=g).to(device)
    times: dict[str, list[float]] = {v: [] for v in variants}

    def step(variant: str) -> None:
        model, opt = built[variant]
        if variant == "hand-ddp" and dtype is not None:
            with torch.autocast(device.type, dtype=dtype):
                out = model(x)
        else:
            out = model(x)
        loss = F.cross_entropy(out.float(), y)
        if args.precision == "fp16":
            scaletrain.backward(loss, model)
        else:
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # keep gradients allocated: they are memory too

    for variant in variants:
        for _ in range(args.warmup):
            step(variant)
    # Interleave one step of each variant at a time (order rotating), so load from other
    # processes on a shared machine falls on all variants alike.
    for i in range(args.rounds * args.steps):
        k = i % len(variants)
        for variant in variants[k:] + variants[:k]:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(variant)
            if cuda:
                torch.cuda.synchronize()
            times[variant].append(time.perf_counter() - t0)
    memory = {v: state_bytes(*built[v]) for v in ("setup-ddp", "setup-zero3")}
    result = {"world_size": env.world_size, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if cuda else platform.processor()
              or platform.machine(),
              "median_ms": {v: 1e3 * statistics.median(t) for v, t in times.items()},
              "steps_per_variant": len(times["hand-ddp"]), "memory": memory,
              # ratio of steps run back to back: cancels slow periods that hit both
              "paired_ratio": {v: statistics.median(a / b for a, b in zip(times[v], times["hand-ddp"]))
                               for v in variants}}
    gathered = [None] * env.world_size
    torch.distributed.all_gather_object(gathered, result)
    if env.rank == 0:
        # one step is as slow as its slowest rank
        result["median_ms"] = {v: max(g["median_ms"][v] for g in gathered) for v in variants}
        result["paired_ratio"] = {v: max(g["paired_ratio"][v] for g in gathered)
                                  for v in variants}
        Path(args.out).write_text(json.dumps(result, indent=1))
    scaletrain.shutdown()
    return 0


def gpt_mfu(args: argparse.Namespace) -> dict:
    """Tokens/s and MFU of a small GPT on one device under setup(strategy='none')."""
    import torch
    import torch.nn.functional as F

    import scaletrain

    env = scaletrain.init(device=None if args.device == "auto" else args.device)
    device = torch.device(env.device)
    model = gpt(args.gpt_layers, args.gpt_dim, args.gpt_heads, args.gpt_seq, args.gpt_vocab)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    model, opt = scaletrain.setup(model, opt, strategy="none", precision=args.precision)
    idx = torch.randint(0, args.gpt_vocab, (args.gpt_batch, args.gpt_seq + 1), device=device)
    times = []
    for i in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())
        scaletrain.backward(loss, model)
        opt.step()
        opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    tokens_s = args.gpt_batch * args.gpt_seq / step_s
    flops_per_token = 6 * n_params + 12 * args.gpt_layers * args.gpt_dim * args.gpt_seq
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name.upper()), None)
    scaletrain.shutdown()
    return {"device_name": name, "params": n_params, "step_ms": 1e3 * step_s,
            "tokens_per_s": tokens_s, "tflops": flops_per_token * tokens_s / 1e12,
            "mfu": (flops_per_token * tokens_s / 1e12 / peak) if peak else None,
            "peak_tflops": peak}


# ------------------------------------------------------------------------- report


def machine() -> str:
    import torch

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", load average {:.1f} (other processes running)".format(os.getloadavg()[0]) \
        if hasattr(os, "getloadavg") else ""
    return (f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores visible"
            f"{load}, Python {platform.python_version()}, torch {torch.__version__}")


def render(res: dict, args: argparse.Namespace, gpt_res: dict | None) -> str:
    ms = res["median_ms"]
    mem = res["memory"]
    mib = 1024 ** 2
    lines = [
        SECTION, "",
        f"`python benchmarks/strategies.py --device {args.device} --precision {args.precision} "
        f"--nproc {args.nproc}` ({time.strftime('%Y-%m-%d')}).",
        f"Machine: {machine()}. {res['world_size']} processes on {res['device']}, CIFAR CNN "
        f"(62k parameters), batch {args.batch} per process, SGD with momentum, "
        f"{res['steps_per_variant']} timed steps per variant, interleaved step by step; "
        "a step's time is the slowest rank's median.", "",
        "| variant | median step (ms) | ratio of medians | median paired ratio |",
        "|---|---:|---:|---:|",
        *(f"| {label} | {ms[v]:.2f} | {ms[v] / ms['hand-ddp']:.3f} | "
          f"{res['paired_ratio'][v]:.3f} |"
          for v, label in (("hand-ddp", "hand-written DDP loop"),
                           ("setup-ddp", '`setup(strategy="ddp")`'),
                           ("setup-zero3", '`setup(strategy="zero3")`'))), "",
        "The paired ratio is the median over steps of (this variant's step) / (the hand-written "
        "step run next to it); it cancels slow periods caused by other load on the machine.", "",
        "Per-rank tensor bytes after a step (parameters + gradients + optimizer state; "
        "DDP's gradient buckets and FSDP's transient gathered parameters not counted):", "",
        "| strategy | params | grads | optimizer | total |", "|---|---:|---:|---:|---:|",
    ]
    for v in ("setup-ddp", "setup-zero3"):
        m = mem[v]
        total = m["params"] + m["grads"] + m["optimizer"]
        lines.append(f"| {v.split('-')[1]} | {m['params'] / mib:.3f} MiB | "
                     f"{m['grads'] / mib:.3f} MiB | {m['optimizer'] / mib:.3f} MiB | "
                     f"{total / mib:.3f} MiB |")
    lines += ["", "Target: `setup(ddp)` / hand-written <= 1.02. On a tiny CNN on CPU, zero3 "
              "pays an all-gather per wrapped layer each forward and backward that compute does "
              "not hide; its point is the 1/W memory, which the table shows.", ""]
    if gpt_res:
        lines += ["### GPT-style model, one device", "",
                  f"{gpt_res['device_name']}: {gpt_res['params'] / 1e6:.1f} M parameters, "
                  f"{gpt_res['step_ms']:.1f} ms/step, {gpt_res['tokens_per_s']:.0f} tokens/s, "
                  f"{gpt_res['tflops']:.1f} TFLOP/s"
                  + (f", MFU {100 * gpt_res['mfu']:.1f}% of {gpt_res['peak_tflops']} TFLOP/s"
                     if gpt_res["mfu"] else "") + ".", ""]
    if args.device != "cuda":
        lines += ["### CUDA", "",
                  "Not measured here (no GPU in this session). On a GPU node run "
                  "`python benchmarks/strategies.py --device cuda --precision bf16 --nproc 2` "
                  "(setup vs hand-written DDP on CUDA with bf16) and "
                  "`python benchmarks/strategies.py --device cuda --precision bf16 --gpt` "
                  "(small GPT-style model, MFU on one GPU); the script rewrites this section.", ""]
    return "\n".join(lines)


def write_section(text: str) -> None:
    """Replace (or append) the Strategies section of docs/benchmarks.md, nothing else."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    old = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    start = old.find(SECTION + "\n")
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    else:
        nxt = old.find("\n## ", start + len(SECTION))
        rest = old[nxt + 1:] if nxt >= 0 else ""
        new = old[:start] + text.rstrip("\n") + "\n" + ("\n" + rest if rest else "")
    DOC.write_text(new)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--batch", type=int, default=32, help="per process")
    p.add_argument("--steps", type=int, default=60, help="timed steps per variant per round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--gpt", action="store_true", help="also measure GPT MFU on one device")
    p.add_argument("--gpt-layers", type=int, default=12)
    p.add_argument("--gpt-dim", type=int, default=768)
    p.add_argument("--gpt-heads", type=int, default=12)
    p.add_argument("--gpt-seq", type=int, default=1024)
    p.add_argument("--gpt-vocab", type=int, default=50304)
    p.add_argument("--gpt-batch", type=int, default=8)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--no-write", action="store_true", help="print, do not edit docs/benchmarks.md")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    # a fresh folder per run: a fixed shared name let two runs read each other's results
    out = Path(args.out or Path(tempfile.mkdtemp(prefix="strategies-bench-")) / "result.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"),
                                                         os.environ.get("PYTHONPATH", "")])}
    if args.device != "cuda":
        env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "scaletrain", "run", "--nproc-per-node", str(args.nproc),
           __file__, "--worker", "--out", str(out), *sys.argv[1:]]
    subprocess.run(cmd, env=env, check=True)
    res = json.loads(out.read_text())
    gpt_res = gpt_mfu(args) if args.gpt else None
    text = render(res, args, gpt_res)
    print(text)
    if not args.no_write:
        write_section(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
