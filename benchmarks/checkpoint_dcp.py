"""Benchmark: checkpoints of device-resident state, Checkpointer against raw torch.save and raw
DCP, with the disk's floor measured in the same run (issue 30).

For each size (``--gib``, default 0.3,1,4 on a GPU; the same divided by 64 on the CPU), fp32
``Linear`` weights on the device, one process:

- ``floor``: ``dd if=/dev/zero bs=16M conv=fsync`` of the same number of bytes (what the disk
  takes to write and flush them);
- ``torch.save``: ``torch.save(model.state_dict())`` into one file + fsync; load:
  ``torch.load(weights_only=True, map_location=device)`` + ``load_state_dict``;
- ``dcp``: ``torch.distributed.checkpoint.save`` of the same state dict (its defaults: one
  writer thread, fsync); load: ``dcp.load`` + ``load_state_dict``;
- ``ours replicated``: ``Checkpointer.save({"model": model})`` (blocking) and ``load_latest``;
- ``dcp sharded`` / ``ours sharded``: the model under ``fully_shard`` (FSDP2, world 1: the
  state is DTensors, written with DCP), raw ``dcp.save(get_model_state_dict(...))`` against
  ``Checkpointer.save``.

Rounds are interleaved (the order rotated each round), an ``os.sync()`` before each timed save.
Round 1 is reported apart (``first``: our first blocking save pins its staging buffers); the
medians and spreads are over rounds 2..``--reps``. Writes ``OUT/checkpoint_dcp.json`` and
``.md``.

    python benchmarks/checkpoint_dcp.py --dir /scratch/$USER/ckb --out ckpt-bench   # a GPU
    python benchmarks/checkpoint_dcp.py --device cpu --dir /tmp/ckb --reps 3        # CPU
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

WIDTH = 4096  # one Linear of WIDTH x WIDTH fp32 = 64 MiB; 1024 (4 MiB) below 0.25 GiB
CPU_SCALE = 64


def _model(gib: float, device: str) -> Any:
    import torch

    width = WIDTH if gib >= 0.25 else 1024
    layers = max(1, round(gib * 2**30 / (width * width * 4)))
    with torch.device(device):
        return torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def dd_floor(folder: Path, nbytes: int) -> float:
    """Seconds ``dd conv=fsync`` takes to write ``nbytes`` of zeros into ``folder``."""
    target = folder / "dd.bin"
    count = max(1, math.ceil(nbytes / (16 * 2**20)))
    os.sync()
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=16M", f"count={count}", "conv=fsync"],
                   check=True, capture_output=True, timeout=600)
    seconds = time.perf_counter() - t0
    target.unlink()
    return seconds * nbytes / (count * 16 * 2**20)


def _cases(model: Any, sharded: Any, folder: Path, device: str,
           opened: list[Any]) -> dict[str, tuple[Callable[[], None], Callable[[], None]]]:
    """(save, load) per case, each save into its own folder under ``folder``; the
    Checkpointers made go into ``opened`` (closed by the caller: they hold pinned buffers)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    import scaletrain

    ours = scaletrain.Checkpointer(folder / "ours", keep=1, exit_on_stop=False)
    ours_sh = scaletrain.Checkpointer(folder / "ours-sharded", keep=1, exit_on_stop=False)
    opened += [ours, ours_sh]
    step = {"n": 0}

    def raw_save() -> None:
        with open(folder / "raw.pt", "wb") as fh:
            torch.save(model.state_dict(), fh)
            fh.flush()
            os.fsync(fh.fileno())

    def raw_load() -> None:
        model.load_state_dict(torch.load(folder / "raw.pt", map_location=device, weights_only=True))

    def dcp_dir(name: str) -> str:
        path = folder / name
        shutil.rmtree(path, ignore_errors=True)  # a fresh folder each save, as ours
        return str(path)

    def dcp_save() -> None:
        dcp.save(model.state_dict(), checkpoint_id=dcp_dir("dcp"))

    def dcp_load() -> None:
        sd = model.state_dict()
        dcp.load(sd, checkpoint_id=str(folder / "dcp"))
        model.load_state_dict(sd)

    def dcp_sh_save() -> None:
        dcp.save(get_model_state_dict(sharded), checkpoint_id=dcp_dir("dcp-sharded"))

    def dcp_sh_load() -> None:
        sd = get_model_state_dict(sharded)
        dcp.load(sd, checkpoint_id=str(folder / "dcp-sharded"))
        set_model_state_dict(sharded, sd)

    def ours_save(ck: Any, m: Any) -> Callable[[], None]:
        def run() -> None:
            step["n"] += 1
            ck.save(step["n"], {"model": m})
            ck.wait()
        return run

    def ours_load(ck: Any, m: Any) -> Callable[[], None]:
        return lambda: ck.load_latest({"model": m})

    return {"torch.save": (raw_save, raw_load), "dcp": (dcp_save, dcp_load),
            "ours replicated": (ours_save(ours, model), ours_load(ours, model)),
            "dcp sharded": (dcp_sh_save, dcp_sh_load),
            "ours sharded": (ours_save(ours_sh, sharded), ours_load(ours_sh, sharded))}


def measure_size(gib: float, *, device: str, reps: int, root: Path) -> dict[str, Any]:
    """One size: the floor, then ``reps`` interleaved rounds of every case's save and load."""
    from torch.distributed.fsdp import fully_shard

    model = _model(gib, device)
    sharded = _model(gib, device)
    fully_shard(sharded)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    folder = Path(tempfile.mkdtemp(prefix="ckdcp-", dir=root))
    opened: list[Any] = []
    try:
        cases = _cases(model, sharded, folder, device, opened)
        names = list(cases)
        times: dict[str, dict[str, list[float]]] = {n: {"save": [], "load": []} for n in names}
        floors = []
        for rnd in range(reps):
            floors.append(dd_floor(folder, nbytes))
            k = rnd % len(names)
            for name in names[k:] + names[:k]:
                save, load = cases[name]
                _sync(device)
                os.sync()
                t0 = time.perf_counter()
                save()
                _sync(device)
                times[name]["save"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                load()
                _sync(device)
                times[name]["load"].append(time.perf_counter() - t0)
    finally:
        for ck in opened:
            ck.close()
        shutil.rmtree(folder, ignore_errors=True)
    return _summary(gib, nbytes, floors, times)


def _summary(gib: float, nbytes: int, floors: list[float],
             times: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    later = slice(1, None) if len(floors) > 1 else slice(None)
    floor = statistics.median(floors[later])
    out: dict[str, Any] = {"gib": round(nbytes / 2**30, 3), "floor_s": round(floor, 3),
                           "floor_gbps": round(nbytes / floor / 1e9, 2), "cases": {}}
    for name, t in times.items():
        row: dict[str, Any] = {}
        for what in ("save", "load"):
            vals = t[what][later]
            row[f"{what}_s"] = round(statistics.median(vals), 3)
            row[f"{what}_spread"] = [round(min(vals), 3), round(max(vals), 3)]
            row[f"{what}_first_s"] = round(t[what][0], 3)
        out["cases"][name] = row
    c = out["cases"]
    out["replicated_save_vs_dcp"] = round(c["dcp"]["save_s"] / c["ours replicated"]["save_s"], 3)
    out["sharded_save_vs_dcp"] = round(c["dcp sharded"]["save_s"] / c["ours sharded"]["save_s"], 3)
    out["replicated_load_vs_torch_load"] = round(c["torch.save"]["load_s"] / c["ours replicated"]["load_s"], 3)
    out["sharded_load_vs_dcp"] = round(c["dcp sharded"]["load_s"] / c["ours sharded"]["load_s"], 3)
    out["replicated_save_vs_floor"] = round(floor / c["ours replicated"]["save_s"], 3)
    return out


def markdown(doc: dict[str, Any]) -> str:
    """One table: a row per size and case, times as median [min-max] of rounds 2..n."""
    lines = [f"{doc['date']}, {doc['device']}, torch {doc['torch']}, {doc['reps']} rounds "
             "(medians of rounds 2..n; ratios: time of the reference / ours)", "",
             "| GiB | dd floor s | case | save s | spread | first save s | load s | spread |",
             "|---:|---:|---|---:|---|---:|---:|---|"]
    for s in doc["sizes"]:
        for name, r in s["cases"].items():
            lines.append(f"| {s['gib']} | {s['floor_s']} | {name} | {r['save_s']} | "
                         f"{r['save_spread'][0]}-{r['save_spread'][1]} | {r['save_first_s']} | "
                         f"{r['load_s']} | {r['load_spread'][0]}-{r['load_spread'][1]} |")
    lines += ["", "| GiB | replicated save vs DCP | sharded save vs DCP | replicated load vs "
              "torch.load | sharded load vs DCP | replicated save vs dd floor |",
              "|---:|---:|---:|---:|---:|---:|"]
    for s in doc["sizes"]:
        lines.append(f"| {s['gib']} | {s['replicated_save_vs_dcp']} | {s['sharded_save_vs_dcp']} | "
                     f"{s['replicated_load_vs_torch_load']} | {s['sharded_load_vs_dcp']} | "
                     f"{s['replicated_save_vs_floor']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import datetime

    import torch

    import scaletrain
    from scaletrain.fileio import atomic_write

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", default="0.3,1,4", help=f"sizes in GiB (divided by {CPU_SCALE} on the CPU)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--dir", default=None, help="where to write (default: TMPDIR)")
    p.add_argument("--out", default="checkpoint-dcp")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    scale = 1.0 if device == "cuda" else 1.0 / CPU_SCALE
    root = Path(args.dir or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    scaletrain.init(device=device)
    sizes = [measure_size(float(g) * scale, device=device, reps=args.reps, root=root)
             for g in args.gib.split(",")]
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
           "torch": torch.__version__, "reps": args.reps, "scale": scale, "sizes": sizes}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "checkpoint_dcp.json", json.dumps(doc, indent=2) + "\n")
    atomic_write(out / "checkpoint_dcp.md", markdown(doc))
    print(markdown(doc))
    scaletrain.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
