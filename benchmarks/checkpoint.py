"""Benchmark: the Checkpointer against raw torch.save/torch.load of the same state (issue 7).

One run measures, side by side and interleaved (raw, ours, raw, ours, ...), on the same disk:

1. replicated state, one process: a model + Adam (~``--mb`` MB of state in all) saved with
   ``Checkpointer.save`` vs ``torch.save`` of ``{"model": sd, "optimizer": sd}`` into one file
   with fsync (the same durability; the figure without fsync is printed too), and loaded with
   ``Checkpointer.load_latest`` vs ``torch.load(weights_only=True)`` + ``load_state_dict``.
   Reported as throughput ratios raw_time / our_time (target >= 0.8).
2. sharded zero3 on 2 ranks (``--nproc 2`` workers through ``scaletrain run``): ours (DCP, a
   shard per rank) vs each rank ``torch.save`` of its local shards (+fsync) and the load back.
3. async_save: a training loop of ``--steps`` steps with one checkpoint, blocking vs async;
   training time lost per checkpoint = loop time minus the loop without a checkpoint, as a
   fraction of what the blocking save costs (target < 20%).

Usage::

    python benchmarks/checkpoint.py --dir /scratch/$USER/bench --mb 150 --reps 5

Prints a markdown table; the figures in docs/benchmarks.md ("Checkpoints") come from it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _model(mb: float, step: bool = True):
    import torch

    # parameters are 1/3 of the state with Adam (two moments per parameter)
    params = int(mb * 1e6 / 4 / 3)
    width = 1024
    layers = max(1, params // (width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    if step:  # Adam's moments exist only after a step
        model(torch.randn(4, width)).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt


def _state_mb(model, opt) -> float:
    n = sum(p.numel() for p in model.parameters())
    return 3 * n * 4 / 1e6


def _raw_save(model, opt, path: Path, fsync: bool) -> None:
    import torch

    with open(path, "wb") as fh:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, fh)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())


def _raw_load(model, opt, path: Path) -> None:
    import torch

    data = torch.load(path, weights_only=True, map_location="cpu")
    model.load_state_dict(data["model"])
    opt.load_state_dict(data["optimizer"])


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def replicated(args) -> dict:
    import scaletrain

    model, opt = _model(args.mb)
    root = Path(args.dir) / "replicated"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    ckpt = scaletrain.Checkpointer(root / "ours", keep=1)
    state = {"model": model, "optimizer": opt}
    times: dict[str, list[float]] = {k: [] for k in
                                     ("raw_save", "raw_save_nofsync", "ours_save", "raw_load",
                                      "ours_load")}
    raw = root / "raw.pt"
    for rep in range(args.reps):
        times["raw_save"].append(_timed(lambda: _raw_save(model, opt, raw, True)))
        times["ours_save"].append(_timed(lambda: ckpt.save(rep + 1, state)))
        times["raw_save_nofsync"].append(_timed(lambda: _raw_save(model, opt, raw, False)))
        times["raw_load"].append(_timed(lambda: _raw_load(model, opt, raw)))
        times["ours_load"].append(_timed(lambda: ckpt.load_latest(state)))
    ckpt.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"mb": _state_mb(model, opt), "median_s": med,
            "save_ratio": med["raw_save"] / med["ours_save"],
            "save_ratio_nofsync": med["raw_save_nofsync"] / med["ours_save"],
            "load_ratio": med["raw_load"] / med["ours_load"]}


def async_cost(args) -> dict:
    import torch

    import scaletrain

    model, opt = _model(args.async_mb)
    x = torch.randn(32, 1024)
    root = Path(args.dir) / "async"
    shutil.rmtree(root, ignore_errors=True)
    state = {"model": model, "optimizer": opt}

    def loop(ckpt) -> float:
        t0 = time.perf_counter()
        for step in range(args.steps):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if ckpt is not None and step == 1:
                ckpt.save(step, state)
        elapsed = time.perf_counter() - t0
        if ckpt is not None:
            ckpt.wait()  # after the clock: the write overlapped the steps, or finishes now
        return elapsed

    blocking = scaletrain.Checkpointer(root / "blocking", keep=1)
    background = scaletrain.Checkpointer(root / "async", keep=1, async_save=True)
    times: dict[str, list[float]] = {"none": [], "blocking": [], "async": []}
    for _ in range(args.reps):
        times["none"].append(loop(None))
        times["blocking"].append(loop(blocking))
        times["async"].append(loop(background))
    blocking.close()
    background.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    lost_block = med["blocking"] - med["none"]
    lost_async = med["async"] - med["none"]
    return {"median_s": med, "steps": args.steps, "lost_blocking_s": lost_block,
            "lost_async_s": lost_async, "async_fraction": lost_async / lost_block}


def sharded_worker(args) -> None:
    """Inside ``scaletrain run``: zero3 on every rank, ours vs raw per-rank torch.save."""
    import torch

    import scaletrain

    env = scaletrain.init()
    model, opt = _model(args.mb, step=False)
    model, opt = scaletrain.setup(model, opt, strategy="zero3", min_params=1)
    model(torch.randn(4, 1024)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    root = Path(args.dir) / "sharded"
    raw = root / f"raw-{env.rank}.pt"
    if env.rank == 0:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    scaletrain.barrier()
    ckpt = scaletrain.Checkpointer(root / "ours", keep=1)
    state = {"model": model, "optimizer": opt}

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    def raw_save() -> None:
        data = {"model": {n: local(p) for n, p in model.named_parameters()},
                "optimizer": {f"{i}.{k}": local(v) for i, s in enumerate(opt.state.values())
                              for k, v in s.items()}}
        with open(raw, "wb") as fh:
            torch.save(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        scaletrain.barrier()  # a checkpoint is done when every rank's part is

    @torch.no_grad()
    def raw_load() -> None:
        data = torch.load(raw, weights_only=True)
        for n, p in model.named_parameters():
            local(p).copy_(data["model"][n])
        for i, s in enumerate(opt.state.values()):
            for k, v in s.items():
                local(v).copy_(data["optimizer"][f"{i}.{k}"])
        scaletrain.barrier()

    times: dict[str, list[float]] = {"raw_save": [], "ours_save": [], "raw_load": [],
                                     "ours_load": []}
    for rep in range(args.reps):
        scaletrain.barrier()
        times["raw_save"].append(_timed(raw_save))
        times["ours_save"].append(_timed(lambda: ckpt.save(rep + 1, state)))
        times["raw_load"].append(_timed(raw_load))
        times["ours_load"].append(_timed(lambda: ckpt.load_latest(state)))
    ckpt.close()
    if env.rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        n = sum(local(p).numel() for p in model.parameters()) * env.world_size
        Path(args.result).write_text(json.dumps({
            "mb": 3 * n * 4 / 1e6, "median_s": med,
            "save_ratio": med["raw_save"] / med["ours_save"],
            "load_ratio": med["raw_load"] / med["ours_load"]}))
    scaletrain.shutdown()


def sharded(args) -> dict:
    result = Path(args.dir) / "sharded.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "scaletrain", "run", "--nproc-per-node", str(args.nproc),
           str(Path(__file__).resolve()), "--worker", "--dir", args.dir, "--mb", str(args.mb),
           "--reps", str(args.reps), "--result", str(result)]
    subprocess.run(cmd, env=env, check=True, timeout=1800)
    return json.loads(result.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=None,
                        help="where the checkpoints go (default: a fresh temporary folder; a fixed "
                             "shared name let two runs delete each other's)")
    parser.add_argument("--mb", type=float, default=150.0)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--async-mb", type=float, default=60.0,
                        help="state size of the async training loop (its steps train the model)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--skip", default="", help="comma list of: replicated, sharded, async")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sharded_worker(args)
        return 0
    if args.dir is None:
        args.dir = tempfile.mkdtemp(prefix="ckpt-bench-")
    import torch

    # one compute thread: the numbers compare I/O paths, and a shared machine's cores are
    # busy (the sharded workers get one thread each from `scaletrain run` already)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    skip = set(args.skip.split(","))
    out = {}
    for name, fn in (("replicated", replicated), ("sharded", sharded), ("async", async_cost)):
        if name not in skip:
            out[name] = fn(args)
            print(json.dumps({name: out[name]}), flush=True)  # partial results survive
    rows = ["| case | state | raw save s | ours save s | save ratio | raw load s | ours load s "
            "| load ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("replicated", "sharded"):
        if name in out:
            r, m = out[name], out[name]["median_s"]
            rows.append(f"| {name} | {r['mb']:.0f} MB | {m['raw_save']:.3f} | "
                        f"{m['ours_save']:.3f} | {r['save_ratio']:.2f} | {m['raw_load']:.3f} | "
                        f"{m['ours_load']:.3f} | {r['load_ratio']:.2f} |")
    print("\n".join(rows))
    if "async" in out:
        a = out["async"]
        print(f"\nasync: loop of {a['steps']} steps: none {a['median_s']['none']:.3f} s, "
              f"blocking {a['median_s']['blocking']:.3f} s, async {a['median_s']['async']:.3f} s"
              f"; lost per checkpoint {a['lost_async_s']:.3f} s vs {a['lost_blocking_s']:.3f} s "
              f"= {100 * a['async_fraction']:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
