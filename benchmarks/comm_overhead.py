"""``bench comm`` against a raw torch.distributed timing loop of the same op and sizes.

    scaletrain run --nproc-per-node 2 benchmarks/comm_overhead.py [--rounds 5] [--sizes 64K..16M:4]

For each collective and size, rounds alternate between ``scaletrain.bench.comm.measure`` and a
hand-written loop (barrier, N calls, the slowest rank's time), so that machine load hits both
alike. Rank 0 prints a markdown table of the median bus bandwidths and their ratio
(bench / raw; target >= 0.9).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import scaletrain
from scaletrain.bench.comm import OPS, bus_factor, iterations_for, make_call, measure, parse_sizes


def raw(op: str, nbytes: int, iters: int, warmup: int) -> float:
    """busbw (GB/s) from the plainest loop torch.distributed allows."""
    world = dist.get_world_size()
    numel = max(world, nbytes // 4 // world * world)
    if op == "all_reduce":
        buf = torch.ones(numel)
        fn = lambda: dist.all_reduce(buf)  # noqa: E731
    elif op == "broadcast":
        buf = torch.ones(numel)
        fn = lambda: dist.broadcast(buf, 0)  # noqa: E731
    else:
        fn, _ = make_call(op, nbytes, device="cpu", world=world, rank=dist.get_rank())
    for _ in range(warmup):
        fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return numel * 4 / t.item() / 1e9 * bus_factor(op, world)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sizes", default="64K..16M:4")
    p.add_argument("--ops", default=",".join(OPS))
    args = p.parse_args()
    env = scaletrain.init()
    rows = []
    for op in args.ops.split(","):
        for size in parse_sizes(args.sizes):
            iters = iterations_for(size)
            ours, theirs = [], []
            for r in range(args.rounds):
                pair = [lambda: measure(op, size, iters=iters, warmup=3, device="cpu").busbw_gbs,
                        lambda: raw(op, size, iters, 3)]
                if r % 2:
                    b, a = pair[1](), pair[0]()
                else:
                    a, b = pair[0](), pair[1]()
                ours.append(a)
                theirs.append(b)
            rows.append((op, size, statistics.median(ours), statistics.median(theirs),
                         statistics.median(o / t for o, t in zip(ours, theirs))))
    if env.rank == 0:
        print("| collective | size | bench comm busbw (GB/s) | raw loop busbw (GB/s) | ratio (median of pairs) |")
        print("|---|---|---|---|---|")
        for op, size, a, b, ratio in rows:
            print(f"| {op} | {size // 1024} KiB | {a:.3f} | {b:.3f} | {ratio:.2f} |")
        ratios = [r[4] for r in rows]
        print(f"\nmedian ratio {statistics.median(ratios):.2f}, min {min(ratios):.2f}; "
              f"{env.world_size} ranks, gloo on CPU, {args.rounds} rounds")
    scaletrain.shutdown()


if __name__ == "__main__":
    main()
