"""Benchmark: the Checkpointer against raw torch.save/torch.load of the same state (issue 7).

One run measures, side by side and interleaved (raw, ours, raw, ours, ...), on the same disk:

1. replicated state, one process: a model + Adam (~``--mb`` MB of state in all) saved with
   ``Checkpointer.save`` vs ``torch.save`` of ``{"model": sd, "optimizer": sd}`` into one file
   with fsync (the same durability; the figure without fsync is printed too), and loaded with
   ``Checkpointer.load_latest`` vs ``torch.load(weights_only=True)`` + ``load_state_dict``.
   Reported as throughput ratios raw_time / our_time (target >= 0.8).
2. sharded zero3 on 2 ranks (``--nproc 2`` workers through ``scaletrain run``): ours (DCP, a
   shard per rank) vs raw DCP with its default options (``dcp.save`` of ``get_state_dict``,
   ``dcp.load`` + ``set_state_dict``, the recipe of DCP's tutorial) and vs each rank
   ``torch.save`` of its local shards (+fsync) and the load back.
3. async_save: a training loop of ``--steps`` steps with one checkpoint, blocking vs async;
   training time lost per checkpoint = loop time minus the loop without a checkpoint, as a
   fraction of what the blocking save costs (target < 20%).

``--mb`` takes a comma list (``300,1200``): every size is measured in the same run. Before each
timed save every rank calls ``os.sync()`` (the previous save's dirty pages are not left to the
next one). Our deletion of old steps runs in the background after a save; the benchmark waits
for it (untimed) before the loads, as the training steps between two saves would. The checksum's share: seconds inside ``zlib.crc32`` per save of ours (rank 0) over
the save's median time.

Usage::

    python benchmarks/checkpoint.py --dir /scratch/$USER/bench --mb 300,1200 --reps 5

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


def _crc_seconds() -> float:
    from scaletrain.checkpoint import checksum

    return checksum.crc_seconds


def _without_crc(fn):
    """``fn`` with the CRC replaced by a constant: the A/B of what the checksum costs a save
    (``--ab-crc``). The checkpoint it writes has wrong checksums; a normal save follows it,
    so loads never see it."""
    def run():
        from scaletrain.checkpoint import checksum

        real = checksum._crc
        checksum._crc = lambda data, value, algorithm=None: 0
        try:
            return fn()
        finally:
            checksum._crc = real
    return run


def _rotated(items: list, rep: int) -> list:
    """``items`` rotated by ``rep``: each variant takes each place in turn. Consecutive GB-sized
    writes slow down on this disk, so a fixed order favours whatever runs first."""
    k = rep % len(items)
    return items[k:] + items[:k]


def _sync_then(fn):
    """``fn`` timed after ``os.sync()``: each save starts with no other save's dirty pages."""
    def run():
        os.sync()
        return _timed(fn)
    return run


def replicated(args, mb: float) -> dict:
    import scaletrain

    model, opt = _model(mb)
    root = Path(args.dir) / "replicated"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    ckpt = scaletrain.Checkpointer(root / "ours", keep=1)
    state = {"model": model, "optimizer": opt}
    times: dict[str, list[float]] = {k: [] for k in
                                     ("raw_save", "raw_save_nofsync", "ours_save", "raw_load",
                                      "ours_load", "crc", "ours_save_nocrc")}
    raw = root / "raw.pt"
    for rep in range(args.reps):
        saves = [("raw_save", lambda: _raw_save(model, opt, raw, True)),
                 ("ours_save", lambda: ckpt.save(20_000 + rep, state)),
                 ("raw_save_nofsync", lambda: _raw_save(model, opt, raw, False))]
        if args.ab_crc:
            saves.append(("ours_save_nocrc",
                          _without_crc(lambda: ckpt.save(10_000 + rep, state))))
        for name, fn in _rotated(saves, rep):
            crc0 = _crc_seconds()
            times[name].append(_sync_then(fn)())
            if name == "ours_save":
                times["crc"].append(_crc_seconds() - crc0)
        ckpt.save(30_000 + rep, state)  # untimed: the newest has its checksums for the load
        ckpt.wait()  # untimed: old steps' deletion, which a training loop overlaps with steps
        loads = [("raw_load", lambda: _raw_load(model, opt, raw)),
                 ("ours_load", lambda: ckpt.load_latest(state))]
        for name, fn in _rotated(loads, rep):
            times[name].append(_timed(fn))
    ckpt.close()
    med = {k: statistics.median(v) for k, v in times.items() if v}
    return {"mb": _state_mb(model, opt), "median_s": med,
            "save_ratio": med["raw_save"] / med["ours_save"],
            "save_ratio_nofsync": med["raw_save_nofsync"] / med["ours_save"],
            "load_ratio": med["raw_load"] / med["ours_load"],
            "crc_share": med["crc"] / med["ours_save"]}


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
    """Inside ``scaletrain run``: zero3 on every rank, ours vs raw DCP vs per-rank torch.save."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

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

    def dcp_dir(rep: int) -> str:
        return str(root / f"dcp-{rep}")

    def dcp_save(rep: int) -> None:  # DCP's tutorial recipe, default options
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=dcp_dir(rep))

    def dcp_load(rep: int) -> None:
        model_sd, optim_sd = get_state_dict(model, opt)
        sd = {"model": model_sd, "optimizer": optim_sd}
        dcp.load(sd, checkpoint_id=dcp_dir(rep))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])

    def synced(fn):
        os.sync()
        scaletrain.barrier()
        return _timed(fn)

    times: dict[str, list[float]] = {k: [] for k in (
        "raw_save", "dcp_save", "ours_save", "raw_load", "dcp_load", "ours_load", "crc",
        "ours_save_nocrc")}
    for rep in range(args.reps):
        saves = [("raw_save", raw_save), ("dcp_save", lambda: dcp_save(rep)),
                 ("ours_save", lambda: ckpt.save(20_000 + rep, state))]
        if args.ab_crc:
            saves.append(("ours_save_nocrc",
                          _without_crc(lambda: ckpt.save(10_000 + rep, state))))
        for name, fn in _rotated(saves, rep):
            crc0 = _crc_seconds()
            times[name].append(synced(fn))
            if name == "ours_save":
                times["crc"].append(_crc_seconds() - crc0)
        ckpt.save(30_000 + rep, state)  # untimed: the newest has its checksums for the load
        ckpt.wait()  # untimed: old steps' deletion, which a training loop overlaps with steps
        loads = [("raw_load", raw_load), ("dcp_load", lambda: dcp_load(rep)),
                 ("ours_load", lambda: ckpt.load_latest(state))]
        for name, fn in _rotated(loads, rep):
            times[name].append(synced(fn))
        scaletrain.barrier()
        if env.rank == 0:  # not timed: raw DCP has no retention of its own
            shutil.rmtree(dcp_dir(rep), ignore_errors=True)
    ckpt.close()
    if env.rank == 0:
        med = {k: statistics.median(v) for k, v in times.items() if v}
        n = sum(local(p).numel() for p in model.parameters()) * env.world_size
        Path(args.result).write_text(json.dumps({
            "mb": 3 * n * 4 / 1e6, "median_s": med,
            "save_ratio": med["raw_save"] / med["ours_save"],
            "load_ratio": med["raw_load"] / med["ours_load"],
            "dcp_save_ratio": med["dcp_save"] / med["ours_save"],
            "dcp_load_ratio": med["dcp_load"] / med["ours_load"],
            "crc_share": med["crc"] / med["ours_save"]}))
    scaletrain.shutdown()


def sharded(args, mb: float) -> dict:
    result = Path(args.dir) / "sharded.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "scaletrain", "run", "--nproc-per-node", str(args.nproc),
           str(Path(__file__).resolve()), "--worker", "--dir", args.dir, "--mb", str(mb),
           "--reps", str(args.reps), "--result", str(result)]
    cmd += ["--ab-crc"] if args.ab_crc else []
    subprocess.run(cmd, env=env, check=True, timeout=1800)
    return json.loads(result.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=None,
                        help="where the checkpoints go (default: a fresh temporary folder; a fixed "
                             "shared name let two runs delete each other's)")
    parser.add_argument("--mb", default="300,1200",
                        help="state sizes in MB (model + Adam), comma-separated")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--async-mb", type=float, default=60.0,
                        help="state size of the async training loop (its steps train the model)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--skip", default="", help="comma list of: replicated, sharded, async")
    parser.add_argument("--ab-crc", action="store_true",
                        help="also time our save with the CRC replaced by a constant")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.mb = float(args.mb)
        sharded_worker(args)
        return 0
    if args.dir is None:
        args.dir = tempfile.mkdtemp(prefix="ckpt-bench-")
    import torch

    # one compute thread: the numbers compare I/O paths, and a shared machine's cores are
    # busy (the sharded workers get one thread each from `scaletrain run` already)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    skip = set(args.skip.split(","))
    sizes = [float(v) for v in args.mb.split(",") if v]
    out: dict[str, dict] = {}
    for mb in sizes:
        for name, fn in (("replicated", replicated), ("sharded", sharded)):
            if name not in skip:
                out[f"{name}@{mb:g}"] = fn(args, mb)
                print(json.dumps({f"{name}@{mb:g}": out[f"{name}@{mb:g}"]}), flush=True)
    if "async" not in skip:
        out["async"] = async_cost(args)
        print(json.dumps({"async": out["async"]}), flush=True)
    print(_table(out))
    if "async" in out:
        a = out["async"]
        print(f"\nasync: loop of {a['steps']} steps: none {a['median_s']['none']:.3f} s, "
              f"blocking {a['median_s']['blocking']:.3f} s, async {a['median_s']['async']:.3f} s"
              f"; lost per checkpoint {a['lost_async_s']:.3f} s vs {a['lost_blocking_s']:.3f} s "
              f"= {100 * a['async_fraction']:.0f}%")
    return 0


def _table(out: dict[str, dict]) -> str:
    rows = ["| case | state | raw save s | DCP save s | ours save s | vs raw | vs DCP | "
            "CRC share | raw load s | DCP load s | ours load s | vs raw | vs DCP |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, r in out.items():
        if key == "async":
            continue
        m = r["median_s"]
        dash = "-"
        rows.append(
            f"| {key.split('@')[0]} | {r['mb']:.0f} MB | {m['raw_save']:.3f} | "
            f"{m['dcp_save']:.3f} | " if "dcp_save" in m else
            f"| {key.split('@')[0]} | {r['mb']:.0f} MB | {m['raw_save']:.3f} | {dash} | ")
        rows[-1] += (f"{m['ours_save']:.3f} | {r['save_ratio']:.2f} | "
                     f"{r.get('dcp_save_ratio', float('nan')):.2f} | "
                     f"{100 * r['crc_share']:.1f}% | {m['raw_load']:.3f} | "
                     f"{m.get('dcp_load', float('nan')):.3f} | {m['ours_load']:.3f} | "
                     f"{r['load_ratio']:.2f} | {r.get('dcp_load_ratio', float('nan')):.2f} |")
    ab = [f"{key}: save {r['median_s']['ours_save']:.3f} s with the CRC, "
          f"{r['median_s']['ours_save_nocrc']:.3f} s without "
          f"({100 * (1 - r['median_s']['ours_save_nocrc'] / r['median_s']['ours_save']):+.1f}%)"
          for key, r in out.items() if "ours_save_nocrc" in r.get("median_s", {})]
    return "\n".join(rows + ([""] + ab if ab else []))


if __name__ == "__main__":
    sys.exit(main())
