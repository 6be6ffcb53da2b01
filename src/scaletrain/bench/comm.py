"""Collective bandwidth, the way nccl-tests defines it.

For a collective moving ``S`` bytes (the total buffer: the output of all_gather, the input of
reduce_scatter) in time ``t`` on ``n`` ranks:

- algorithm bandwidth ``algbw = S / t``;
- bus bandwidth ``busbw = algbw x factor``, with the factor that makes it comparable to the
  link's speed whatever the algorithm: all_reduce ``2(n-1)/n``, all_gather and reduce_scatter
  ``(n-1)/n``, broadcast 1 (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md).

The time of one size is the mean over ``iters`` back-to-back calls after ``warmup`` calls,
taken as the slowest rank's (a collective ends when the last rank has it).
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from typing import Any

from scaletrain.errors import UsageError
from scaletrain.runtime.current import collective_device, group_rank_world

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of ``op`` on ``n`` ranks."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise UsageError(f"unknown collective {op!r}", f"use one of: {', '.join(OPS)}")


MAX_SIZE = 16 * 1024 ** 3   # one message; nccl-tests' largest default is 8G, and a buffer this big
MAX_SIZES = 64              # sizes in one run (1..16G doubling is 35)


def parse_size(text: str) -> int:
    """``"64K"`` -> 65536 (binary units K, M, G; a plain number is bytes), at most ``MAX_SIZE``."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([KMG]?)(?:I?B)?\s*", text.upper())
    # more than 12 digits is past the bound whatever the unit (and int() of 4300+ digits raises)
    value = (int(m.group(1)) if len(m.group(1)) <= 12 else MAX_SIZE + 1) * _UNITS[m.group(2)] if m else 0
    if not m or value == 0:
        raise UsageError(f"bad message size {text[:40]!r}", "write sizes like 1K, 64M, 1G")
    if value > MAX_SIZE:
        raise UsageError(f"message size {text.strip()[:40]!r} is more than {MAX_SIZE // 1024 ** 3}G",
                         "benchmark sizes up to 16G, e.g. --sizes 1K..1G")
    return value


def parse_sizes(text: str) -> list[int]:
    """``"1K..1M"`` (doubling), ``"1K..1M:4"`` (x4 steps) or ``"1M,16M"`` to byte sizes (at least one)."""
    text = text.strip()
    hint = "write LOW..HIGH[:FACTOR] or a list, e.g. 1K..64M, 1K..1G:4 or 1M,16M"
    if ".." in text:
        span, _, factor_text = text.partition(":")
        low_text, high_text = span.split("..", 1)
        low, high = parse_size(low_text), parse_size(high_text)
        factor_text = factor_text.strip()
        if factor_text and not re.fullmatch(r"[0-9]{1,6}", factor_text):
            raise UsageError(f"bad size range factor {factor_text[:40]!r}", hint)
        factor = int(factor_text) if factor_text else 2
        if low > high or factor < 2:
            raise UsageError(f"bad size range {text[:60]!r}", hint)
        sizes = []
        size = low
        while size <= high:
            sizes.append(size)
            size *= factor
    else:
        sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise UsageError(f"--sizes {text[:40]!r} names no message size", hint)
    if len(sizes) > MAX_SIZES:
        raise UsageError(f"--sizes {text[:40]!r} gives {len(sizes)} sizes, more than {MAX_SIZES}", hint)
    return sizes


def parse_ops(text: str) -> list[str]:
    """``"all_reduce,broadcast"`` or ``"all"`` to a list of collectives."""
    ops = list(OPS) if text.strip() == "all" else [o.strip() for o in text.split(",") if o.strip()]
    for op in ops:
        bus_factor(op, 2)  # validates the name
    return ops


@dataclass(frozen=True, kw_only=True)
class CommResult:
    """One collective at one size."""

    op: str
    bytes: int
    world_size: int
    time_s: float
    algbw_gbs: float
    busbw_gbs: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def result(op: str, nbytes: int, seconds: float, world: int) -> CommResult:
    """Bandwidths from a measured time (GB = 1e9 bytes, as nccl-tests prints)."""
    algbw = nbytes / seconds / 1e9
    return CommResult(op=op, bytes=nbytes, world_size=world, time_s=seconds, algbw_gbs=algbw,
                      busbw_gbs=algbw * bus_factor(op, world))


def make_call(op: str, nbytes: int, *, device: Any, world: int, rank: int) -> tuple[Any, list[Any]]:
    """A zero-argument function doing ``op`` on buffers of ``nbytes`` total (float32), and
    those buffers."""
    import torch
    import torch.distributed as dist

    numel = max(world, nbytes // 4 // world * world)  # divisible by the world size
    if op == "all_reduce":
        buf = torch.ones(numel, device=device)
        return lambda: dist.all_reduce(buf), [buf]
    if op == "all_gather":
        out = torch.empty(numel, device=device)
        part = torch.ones(numel // world, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch < 2.13
        return lambda: gather(out, part), [out, part]
    if op == "reduce_scatter":
        inp = torch.ones(numel, device=device)
        part = torch.empty(numel // world, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, inp), [part, inp]
    if op == "broadcast":
        buf = torch.ones(numel, device=device)
        return lambda: dist.broadcast(buf, src=0), [buf]
    raise UsageError(f"unknown collective {op!r}", f"use one of: {', '.join(OPS)}")


def measure(op: str, nbytes: int, *, iters: int, warmup: int, device: Any) -> CommResult:
    """Time ``op`` on ``nbytes`` on every rank (a collective call: all ranks must call it)."""
    import torch
    import torch.distributed as dist

    from scaletrain.runtime import collectives, settle

    rank, world = group_rank_world()
    call, buffers = make_call(op, nbytes, device=device, world=world, rank=rank)
    before = settle.holders(buffers)
    sync = (lambda: torch.cuda.synchronize(device)) if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(warmup):
        call()
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    sync()
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64,
                           device=collective_device())  # NCCL reduces only device tensors
    collectives.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
    settle.let_go(buffers, before)  # the timed calls' works, after the timing
    numel = max(world, nbytes // 4 // world * world)
    return result(op, numel * 4, float(elapsed.item()), world)


def iterations_for(nbytes: int, *, budget_bytes: int = 2 * 1024 ** 3, lo: int = 5, hi: int = 50) -> int:
    """Fewer iterations for big messages, so every size takes a similar, bounded time."""
    return max(lo, min(hi, budget_bytes // max(1, nbytes)))


def format_table(results: list[CommResult]) -> str:
    """A nccl-tests-like table: size, time, algbw, busbw per collective."""
    lines = [f"{'collective':<15}{'size':>10}{'time (us)':>13}{'algbw GB/s':>12}{'busbw GB/s':>12}"]
    for r in results:
        size = r.bytes
        unit = next((u for u, s in (("G", 1024 ** 3), ("M", 1024 ** 2), ("K", 1024)) if size >= s), "")
        scale = _UNITS[unit]
        label = f"{size / scale:g}{unit}" if unit else f"{size}B"
        lines.append(f"{r.op:<15}{label:>10}{r.time_s * 1e6:>13.1f}{r.algbw_gbs:>12.3f}{r.busbw_gbs:>12.3f}")
    return "\n".join(lines)
