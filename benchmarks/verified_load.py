"""Benchmark: what loading only checked bytes costs, against the path it replaced.

One file of ``--mb`` MB (a model + Adam state, written by ``safeio.save_file``: whole-file and
per-block checksums), read in the page cache (a first read untimed), three ways, interleaved
(the order rotates each round), ``--reps`` rounds, medians:

- ``raw``: ``torch.load(path, weights_only=True)``, nothing checked (the floor);
- ``before``: the path replaced (up to commit 39e04f3): a thread checks the whole file's
  checksum in 256 KiB ``read()`` calls while ``torch.load(path)`` reads it again by name;
- ``after``: ``torch.load`` from a ``verified.VerifiedFile``: each 4 MiB block read once,
  straight into the tensor's memory, and checked there.

Wall seconds and this process's CPU seconds (both cores' work: the ``before`` thread's too) per
load; ratios are ``before``/``after`` and ``raw``/``after`` (>= 1: ``after`` is faster).
``--cold`` also measures each way with the file's pages dropped from the page cache before
each load (``posix_fadvise(DONTNEED)``: what a resume on a fresh node reads), in the same
rotation.

    python benchmarks/verified_load.py --dir /work/vlb --mb 64,300 --reps 7 --cold
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def _state(mb: float) -> dict[str, Any]:
    import torch

    width = 1024
    layers = max(1, int(mb * 1e6 / 4 / 3) // (width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, width)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def _ways(path: Path, marker: dict[str, Any]) -> dict[str, Callable[[], None]]:
    import torch

    from scaletrain.checkpoint import checksum, verified

    expect = verified.expected(marker, path.name)

    def raw() -> None:
        torch.load(path, weights_only=True)

    def before() -> None:
        def check() -> None:
            scratch, value = memoryview(bytearray(1 << 18)), 0
            with open(path, "rb", buffering=0) as fh:
                raw_fh: Any = fh
                while n := raw_fh.readinto(scratch):
                    value = checksum.crc(scratch[:n], value, checksum.ALGORITHM)
        thread = threading.Thread(target=check)
        thread.start()
        torch.load(path, weights_only=True)
        thread.join()

    def after() -> None:
        with verified.VerifiedFile(path, expect, name=path.name) as fh:
            torch.load(fh, weights_only=True)

    return {"raw": raw, "before": before, "after": after}


def _drop(path: Path) -> None:
    """The file's pages out of the page cache (a no-op where the file system keeps them)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure(mb: float, folder: Path, reps: int, cold: bool = False) -> dict[str, Any]:
    from scaletrain.checkpoint import checksum
    from scaletrain.checkpoint.safeio import save_file

    path = folder / f"state-{mb:g}.pt"
    size, (whole, blocks) = save_file(_state(mb), path)
    marker = {"files": {path.name: size}, checksum.ALGORITHM: {path.name: whole},
              "blocks": {"bytes": checksum.BLOCK_BYTES, checksum.ALGORITHM: {path.name: blocks}}}
    ways = _ways(path, marker)
    if cold:
        for name in list(ways):
            ways[f"{name} cold"] = (lambda way: lambda: (_drop(path), way())[1])(ways[name])
    names = list(ways)
    ways["raw"]()  # into the page cache
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(reps):
        k = rnd % len(names)
        for name in names[k:] + names[:k]:
            t0, c0 = time.perf_counter(), time.process_time()
            ways[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    path.unlink()
    med = {n: statistics.median(wall[n]) for n in names}
    return {"mb": size / 1e6, "wall": med, "spread": {n: (min(wall[n]), max(wall[n])) for n in names},
            "cpu": {n: statistics.median(cpu[n]) for n in names}}


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", default="64,300")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--dir", default=None)
    p.add_argument("--cold", action="store_true", help="also with the page cache dropped before each load")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    root = Path(args.dir or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="vlb-", dir=root))
    out = io.StringIO()
    out.write(f"torch {torch.__version__}, {args.reps} rounds, medians (spread min-max), "
              f"load average {os.getloadavg()[0]:.1f} at the start\n\n")
    out.write("| MB | cache | raw s | before s | after s | before/after | raw/after | CPU s raw | before | after |\n")
    out.write("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for mb in (float(m) for m in args.mb.split(",")):
        r = measure(mb, folder, args.reps, args.cold)
        w, c, sp = r["wall"], r["cpu"], r["spread"]
        for cache, tag in (("warm", ""), ("cold", " cold")) if args.cold else (("warm", ""),):
            raw, before, after = (f"raw{tag}", f"before{tag}", f"after{tag}")
            out.write(f"| {r['mb']:.0f} | {cache} | {w[raw]:.3f} ({sp[raw][0]:.3f}-{sp[raw][1]:.3f}) | "
                      f"{w[before]:.3f} ({sp[before][0]:.3f}-{sp[before][1]:.3f}) | "
                      f"{w[after]:.3f} ({sp[after][0]:.3f}-{sp[after][1]:.3f}) | "
                      f"**{w[before] / w[after]:.2f}** | {w[raw] / w[after]:.2f} | "
                      f"{c[raw]:.3f} | {c[before]:.3f} | {c[after]:.3f} |\n")
    out.write(f"\nload average {os.getloadavg()[0]:.1f} at the end\n")
    folder.rmdir()
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
