"""Benchmark: what a checkpoint's checksum costs, CRC-32C (the crc32c package) against zlib's CRC-32.

One run measures, side by side in alternating rounds in one process:

1. throughput of each algorithm over the same ``--mb`` MB buffer (GB/s, median of ``--reps``);
2. a replicated ``Checkpointer.save`` of a model + Adam state of ``--mb`` MB, with each algorithm
   and with the checksum replaced by a constant (the A/B), after an ``os.sync()`` each; the cost
   of a checksum = CPU seconds inside it per save / the save's time (median), and the wall-clock
   difference with / without;
3. the check of bytes a load does not read (``verified.file_crc``) over a file of the
   throughput's size in the page cache: bounded ``read()`` calls against the memory map used
   until issue 39 (an I/O error there is SIGBUS), alternating, GB/s (median).

Usage::

    python benchmarks/checksum.py --dir /tmp/ckb --mb 1200 --reps 5

Prints a markdown table; the figures in docs/benchmarks.md ("What the checksum costs") come from it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

VARIANTS = ("crc32", "crc32c", "none")


def _throughput(mb: int, reps: int) -> dict[str, float]:
    """GB/s of each algorithm over one buffer of ``mb`` MB, alternating, medians."""
    from scaletrain.checkpoint import checksum

    buf = memoryview(os.urandom(mb << 20))
    times: dict[str, list[float]] = {"crc32": [], "crc32c": []}
    for rep in range(reps):
        for name in (("crc32", "crc32c") if rep % 2 == 0 else ("crc32c", "crc32")):
            t0 = time.perf_counter()
            checksum._FUNCTIONS[name](buf, 0)
            times[name].append(time.perf_counter() - t0)
    return {k: (mb / 1024) / statistics.median(v) for k, v in times.items()}


def _mapped_crc(path: Path, algorithm: str) -> int:
    """The check as it was until issue 39: the whole file mapped (the A of the A/B)."""
    import mmap

    from scaletrain.checkpoint import checksum

    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return checksum._crc(mapped, 0, algorithm)


def _verify(directory: Path, mb: int, reps: int) -> dict[str, float]:
    """GB/s of the pre-load check (the algorithm saves use), read() against mmap, over one
    cached file, alternating."""
    from scaletrain.checkpoint import checksum, verified

    path = directory / "verify.bin"
    path.write_bytes(os.urandom(mb << 20))
    ways = {"read": lambda: verified.file_crc(path, checksum.ALGORITHM),
            "mmap": lambda: _mapped_crc(path, checksum.ALGORITHM)}
    expected = ways["mmap"]()  # also puts the file in the page cache
    times: dict[str, list[float]] = {k: [] for k in ways}
    for rep in range(reps):
        for name in (("read", "mmap") if rep % 2 == 0 else ("mmap", "read")):
            t0 = time.perf_counter()
            if ways[name]() != expected:
                raise SystemExit(f"the {name} checksum differs")
            times[name].append(time.perf_counter() - t0)
    path.unlink()
    return {k: (mb / 1024) / statistics.median(v) for k, v in times.items()}


def _state(mb: int) -> dict:
    """A model + Adam state of about ``mb`` MB (parameters, two moments: 3 copies of fp32)."""
    import torch

    n = max(1, (mb << 20) // 4 // 3 // 1024)
    model = torch.nn.Linear(1024, n, bias=False)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 1024)).sum().backward()
    opt.step()
    return {"model": model, "optimizer": opt}


def _saves(directory: Path, mb: int, reps: int) -> dict[str, dict[str, float]]:
    """Median save seconds and checksum seconds per variant, rounds in rotating order."""
    import scaletrain
    from scaletrain.checkpoint import checksum

    state = _state(mb)
    ckpt = scaletrain.Checkpointer(directory, keep=1)
    real = checksum._crc
    wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    step = 0
    for rep in range(reps):
        for variant in VARIANTS[rep % 3:] + VARIANTS[:rep % 3]:
            step += 1
            checksum.ALGORITHM = variant if variant != "none" else "crc32"
            checksum._crc = real if variant != "none" else (lambda data, value, algorithm=None: 0)
            os.sync()
            before = checksum.crc_seconds
            t0 = time.perf_counter()
            ckpt.save(step, state)
            ckpt.wait()
            wall[variant].append(time.perf_counter() - t0)
            cpu[variant].append(checksum.crc_seconds - before)
    checksum._crc = real
    ckpt.close()
    return {v: {"save": statistics.median(wall[v]), "crc": statistics.median(cpu[v])}
            for v in VARIANTS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to save (default: a temporary folder)")
    parser.add_argument("--mb", type=int, default=1200)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from scaletrain.checkpoint import checksum

    if "crc32c" not in checksum._FUNCTIONS:
        print("the crc32c package is not installed: pip install crc32c", file=sys.stderr)
        return 2
    root = Path(args.dir or tempfile.mkdtemp(prefix="scaletrain_crc_"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        rate = _throughput(min(args.mb, 512), args.reps)
        algorithm = checksum.ALGORITHM      # before _saves sets it variant by variant
        verify = _verify(root, min(args.mb, 512), args.reps)
        saves = _saves(root / "ck", args.mb, args.reps)
    finally:
        shutil.rmtree(root / "ck", ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"checksums, {args.mb} MB replicated save, {args.reps} rounds, load {load:.1f}, "
          f"crc32c hardware: {getattr(checksum._crc32c, 'hardware_based', False)}\n")
    print(f"throughput: crc32 {rate['crc32']:.2f} GB/s, crc32c {rate['crc32c']:.2f} GB/s "
          f"({rate['crc32c'] / rate['crc32']:.2f}x)\n")
    print(f"check before a load ({algorithm}, cached file): read() "
          f"{verify['read']:.2f} GB/s, mmap {verify['mmap']:.2f} GB/s "
          f"({verify['read'] / verify['mmap']:.2f}x)\n")
    print("| checksum | save s (median) | checksum CPU s | CPU share | wall vs none |")
    print("|---|---:|---:|---:|---:|")
    none = saves["none"]["save"]
    for v in VARIANTS:
        s = saves[v]
        share = s["crc"] / s["save"] if v != "none" else 0.0
        print(f"| {v} | {s['save']:.3f} | {s['crc']:.3f} | {100 * share:.1f}% | "
              f"{100 * (s['save'] - none) / none:+.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
