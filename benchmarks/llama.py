"""Benchmark: a ~1B-parameter Llama-style decoder trained by hand, through scaletrain.setup(), and
by torchtitan's own trainer, side by side (issue 30).

Variants (``--variants``), each on the same model (benchmarks/llama_model.py), bf16, AdamW:

- ``hand``: a hand-written FSDP2 loop: ``fully_shard`` on each block then the root with a bf16
  ``MixedPrecisionPolicy`` (fp32 gradient reduction), what torchtitan's FSDP path does;
- ``zero3`` / ``ddp``: ``scaletrain.setup(model, opt, strategy=..., precision="bf16")``
  (zero3 wraps each block, ``wrap=(Block,)``), ``scaletrain.backward(loss)``;
- ``titan``: torchtitan's trainer on the same shape (benchmarks/llama_titan.py), where its
  wheel is installed; otherwise the row says it is not.

Each combination of ``--seq``, ``--ac`` (activation checkpointing per block) and ``--compile``
(``torch.compile`` per block, as torchtitan does) runs its variants interleaved: ``--repeats``
rounds, the order rotated each round (A B C, B C A, ...); each trial builds the model afresh,
warms up, then times ``--steps`` steps. The table gives the median tokens/s with the spread
(min-max over rounds), MFU against the card's datasheet peak
(``scaletrain.observe.flops.PEAK_FLOPS``), FLOPs per token from the config
(``llama_model.flops_per_token``), peak GPU memory, and each variant against ``hand``.
The batch is the largest power of two up to ``--max-batch`` whose eager ``hand`` step fits
(``--batch 0``, a probe, the default on a GPU); a variant that runs out of memory there is
retried at half the batch (its row says the batch it ran).

    python benchmarks/llama.py --out llama-bench                       # a GPU: 1b, probe
    python benchmarks/llama.py --size toy --device cpu --out /tmp/l    # CPU, end to end
    python -m scaletrain run --nproc-per-node 2 benchmarks/llama.py ...   # several ranks

Writes ``OUT/llama.json`` and ``OUT/llama.md``; figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "src")]

import llama_model  # noqa: E402  (beside this file)
import llama_titan  # noqa: E402

VARIANTS = ("hand", "zero3", "ddp", "titan")


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _wrap(variant: str, model: Any, args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(model to call, optimizer, backward function) for one in-process variant."""
    import torch

    import scaletrain

    fused = {"fused": True} if args.device.startswith("cuda") else {}
    bf16 = args.precision == "bf16"
    if variant == "hand":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
            else MixedPrecisionPolicy()
        for block in model.layers:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
        return model, opt, lambda loss: loss.backward()
    extra = {"wrap": (llama_model.block_class(),)} if variant == "zero3" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
    wrapped, opt = scaletrain.setup(model, opt, strategy=variant, precision=args.precision, **extra)
    return wrapped, opt, scaletrain.backward


def trial(variant: str, cfg: Any, seq: int, batch: int, *, compiled: bool, ac: bool,
          steps: int, warmup: int, args: argparse.Namespace) -> dict[str, Any]:
    """Build, warm up and time one variant; tokens/s over ``steps`` steps (all ranks)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    cuda = args.device.startswith("cuda")
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    world = dist.get_world_size() if dist.is_initialized() else 1
    model = opt = None
    try:
        model = llama_model.build(cfg, seq, device=args.device)
        model.checkpointing = ac
        if compiled:  # per block, before sharding, as torchtitan does
            for block in model.layers:
                block.compile()
        run, opt, backward = _wrap(variant, model, args)
        gen = torch.Generator(device="cpu").manual_seed(1)
        data = torch.randint(0, cfg.vocab, (batch, seq + 1), generator=gen).to(args.device)

        def step() -> None:
            logits = run(data[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), data[:, 1:].flatten())
            backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(warmup):
            step()
        _sync(args.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(args.device)
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        return {"tokens_s": batch * seq * world * steps / seconds, "step_s": seconds / steps,
                "peak_gib": peak, "batch": batch}
    except torch.OutOfMemoryError:
        return {"oom": True, "batch": batch}
    finally:
        del model, opt
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def probe_batch(cfg: Any, seq: int, *, ac: bool, args: argparse.Namespace) -> int:
    """The largest power-of-two batch (<= --max-batch) whose eager hand step fits."""
    best, batch = 0, 1
    while batch <= args.max_batch:
        if trial("hand", cfg, seq, batch, compiled=False, ac=ac, steps=1, warmup=1,
                 args=args).get("oom"):
            break
        best, batch = batch, batch * 2
    return best


def _rotated(items: list[str], k: int) -> list[str]:
    k %= len(items)
    return items[k:] + items[:k]


def measure(args: argparse.Namespace, publish: Any = None) -> dict[str, Any]:
    """Every combination's interleaved rounds; the rows of the table. ``publish(doc)`` is
    called after each combination (a run cut short by a time limit keeps what it measured)."""
    import torch

    from scaletrain.observe.flops import peak_flops

    cfg = llama_model.SIZES[args.size]
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    peak = peak_flops(name) if args.device.startswith("cuda") else None
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    total, body = cfg.parameters()
    rows: list[dict[str, Any]] = []
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": name, "torch": torch.__version__, "world": world, "size": args.size,
           "config": vars(cfg) | {"parameters": total, "non_embedding": body},
           "precision": args.precision, "peak_tflops": peak / 1e12 if peak else None,
           "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "rows": rows}
    start = time.perf_counter()
    for seq in args.seqs:
        for ac in args.acs:
            batch = args.batch or probe_batch(cfg, seq, ac=ac, args=args)
            for compiled in args.compiles:
                runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
                for rnd in range(args.repeats):
                    if time.perf_counter() - start > args.budget_s:
                        break
                    for variant in _rotated(list(args.variants), rnd):
                        runs[variant].append(_one(variant, cfg, seq, batch, compiled, ac, args))
                rows.extend(_rows(runs, seq=seq, ac=ac, compiled=compiled,
                                  fpt=llama_model.flops_per_token(cfg, seq), peak=peak, world=world))
                if publish is not None:
                    publish(doc)
    return doc


def _one(variant: str, cfg: Any, seq: int, batch: int, compiled: bool, ac: bool,
         args: argparse.Namespace) -> dict[str, Any]:
    if variant == "titan":
        return llama_titan.run(cfg, seq, batch, compiled=compiled, ac=ac, steps=args.steps,
                               warmup=args.warmup, device=args.device)
    if batch < 1:
        return {"oom": True, "batch": batch}
    try:
        out = trial(variant, cfg, seq, batch, compiled=compiled, ac=ac, steps=args.steps,
                    warmup=args.warmup, args=args)
        if out.get("oom") and batch > 1:  # this variant needs more memory than the probe's
            out = trial(variant, cfg, seq, batch // 2, compiled=compiled, ac=ac, steps=args.steps,
                        warmup=args.warmup, args=args)
    except Exception as exc:  # noqa: BLE001 - one variant's failure must not hide the others' rows
        lines = str(exc).strip().splitlines()
        out = {"error": f"{type(exc).__name__}: {(lines[0] if lines else '')[:160]}"}
    return out


def _rows(runs: dict[str, list[dict[str, Any]]], *, seq: int, ac: bool, compiled: bool,
          fpt: float, peak: float | None, world: int) -> list[dict[str, Any]]:
    hand = [r["tokens_s"] for r in runs.get("hand", []) if "tokens_s" in r]
    out = []
    for variant, trials in runs.items():
        row: dict[str, Any] = {"variant": variant, "seq": seq, "ac": ac, "compile": compiled}
        good = [t for t in trials if "tokens_s" in t]
        if not good:
            why = next((t.get("skipped") or ("out of memory" if t.get("oom") else t.get("error"))
                        for t in trials), "not run (time budget)")
            out.append({**row, "status": why})
            continue
        tps = [t["tokens_s"] for t in good]
        med = statistics.median(tps)
        peaks = [t["peak_gib"] for t in good if t.get("peak_gib") is not None]
        row |= {"status": "ok", "batch": good[0]["batch"], "tokens_s": round(med, 1),
                "tokens_s_min": round(min(tps), 1), "tokens_s_max": round(max(tps), 1),
                "rounds": len(tps), "tflops": float(f"{med * fpt / world / 1e12:.3g}"),
                "mfu": round(med * fpt / world / peak, 4) if peak else None,
                "peak_gib": round(max(peaks), 2) if peaks else None,
                "vs_hand": round(med / statistics.median(hand), 3) if hand else None}
        out.append(row)
    return out


def markdown(doc: dict[str, Any]) -> str:
    """The table of docs/benchmarks.md: one row per variant and combination."""
    cfg = doc["config"]
    lines = [f"{doc['date']}, {doc['device']}, torch {doc['torch']}, world {doc['world']}, "
             f"size {doc['size']} ({cfg['parameters']:.3g} parameters, "
             f"{cfg['non_embedding']:.3g} outside the embedding), {doc['precision']}, "
             f"peak {doc['peak_tflops'] or '-'} TFLOP/s, {doc['steps']} timed steps after "
             f"{doc['warmup']}, {doc['repeats']} interleaved rounds", "",
             "| variant | seq | AC | compile | batch | tokens/s (median) | spread | TFLOP/s | MFU "
             "| peak GiB | vs hand |", "|---|---:|---|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        flags = f"| {r['variant']} | {r['seq']} | {'on' if r['ac'] else 'off'} | " \
                f"{'on' if r['compile'] else 'off'} |"
        if r["status"] != "ok":
            lines.append(f"{flags} - | {r['status']} | | | | | |")
            continue
        mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] is not None else "-"
        lines.append(f"{flags} {r['batch']} | {r['tokens_s']:,.0f} | {r['tokens_s_min']:,.0f}-"
                     f"{r['tokens_s_max']:,.0f} ({r['rounds']}) | {r['tflops']} | {mfu} | "
                     f"{r['peak_gib'] if r['peak_gib'] is not None else '-'} | "
                     f"{r['vs_hand'] if r['vs_hand'] is not None else '-'} |")
    return "\n".join(lines) + "\n"


def _choice(value: str, on_gpu: bool) -> list[bool]:
    return {"on": [True], "off": [False], "both": [False, True]}[value] if value != "auto" \
        else ([False, True] if on_gpu else [False])


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line, with GPU or CPU defaults filled in."""
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(llama_model.SIZES), default=None,
                   help="model size (default: 1b on a GPU, toy on the CPU)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--seq", default=None, help="comma list (default 2048,8192; toy: 64)")
    p.add_argument("--batch", type=int, default=None, help="per rank; 0 = probe (GPU default)")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--compile", choices=["auto", "on", "off", "both"], default="auto")
    p.add_argument("--ac", choices=["on", "off", "both"], default="both")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=3600.0,
                   help="start no new round after this many seconds")
    p.add_argument("--out", default="llama-bench")
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available() and args.device != "cpu"
    args.device = "cuda" if gpu else "cpu"
    args.size = args.size or ("1b" if gpu else "toy")
    toy = args.size == "toy"
    args.seqs = [int(s) for s in (args.seq or ("64" if toy else "2048,8192")).split(",")]
    args.batch = args.batch if args.batch is not None else (0 if gpu else 2)
    args.compiles = _choice(args.compile, gpu)
    args.acs = _choice(args.ac, gpu)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch.distributed as dist

    import scaletrain
    from scaletrain.fileio import atomic_write

    scaletrain.init(device=args.device)
    first = not dist.is_initialized() or dist.get_rank() == 0
    out = Path(args.out)

    def publish(doc: dict[str, Any]) -> None:
        if first:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write(out / "llama.json", json.dumps(doc, indent=2) + "\n")
            atomic_write(out / "llama.md", markdown(doc))

    doc = measure(args, publish)
    publish(doc)
    if first:
        print(markdown(doc))
    scaletrain.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
