"""Worker of ``scaletrain bench comm``: every rank runs it; rank 0 writes ``comm.json``.

    scaletrain run --nproc-per-node 2 -m scaletrain.bench.comm_worker --out DIR [--ops ...] [--sizes ...]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from typing import Sequence

from scaletrain.bench.comm import format_table, iterations_for, measure, parse_ops, parse_sizes
from scaletrain.fileio import atomic_write, json_text, writable_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by the worker and ``scaletrain bench comm``."""
    p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,broadcast", metavar="OPS",
                   help="collectives, comma-separated, or 'all' (default: all four)")
    p.add_argument("--sizes", default="1K..16M:4", metavar="RANGE",
                   help="message sizes: LOW..HIGH[:FACTOR] or a list (default 1K..16M:4; on GPUs try 1K..1G)")
    p.add_argument("--iters", type=int, default=None, metavar="N",
                   help="timed calls per size (default: 5-50, fewer for big messages)")
    p.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed calls first (default 3)")
    p.add_argument("--out", metavar="DIR", default=None, help="write DIR/comm.json")


def run(args: argparse.Namespace) -> list[dict]:
    """Measure every op and size on this rank (all ranks call it); rank 0 reports."""
    import scaletrain

    ops, sizes = parse_ops(args.ops), parse_sizes(args.sizes)
    env = scaletrain.init()
    results = []
    for op in ops:
        for size in sizes:
            iters = args.iters or iterations_for(size)
            results.append(measure(op, size, iters=iters, warmup=args.warmup, device=env.device))
    rows = [r.to_dict() for r in results]
    if env.rank == 0:
        print(f"scaletrain bench comm: {env.world_size} ranks, {env.num_nodes} node(s), "
              f"{env.backend} on {env.device}")
        print(format_table(results))
        if args.out:
            out = writable_dir(args.out, "--out")
            doc = {"kind": "comm", "world_size": env.world_size, "nodes": env.num_nodes,
                   "backend": env.backend, "device": env.device, "host": platform.node(),
                   "results": rows}
            atomic_write(out / "comm.json", json_text(doc, indent=2) + "\n")
            print(f"scaletrain bench comm: wrote {out / 'comm.json'}")
    sys.stdout.flush()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scaletrain.bench.comm_worker", allow_abbrev=False)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        run(args)
    finally:
        import scaletrain

        scaletrain.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
