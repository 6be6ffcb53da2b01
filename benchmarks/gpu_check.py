"""The GPU acceptance run: every GPU figure scaletrain claims, measured in one command.

    python benchmarks/gpu_check.py [--out gpu-check] [--budget-s 540]
    bash scripts/gpu-check.sh [OUT]          # installs what is missing first, then this

Writes ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` (one table). Each step reports ``ok``
with its figures, ``failed`` with the error's last line, or ``skipped`` with the reason (on a
machine without a GPU every GPU step says "skipped: no GPU", so the command runs end to end on
a CPU and CI runs that form). The steps, cheapest first, each under its own time limit so the
whole run fits a 10-minute command:

- ``environment``: torch, CUDA or ROCm (HIP), the card and its datasheet bf16 peak;
- ``gpu tests``: ``pytest -m gpu`` (the GPU-marked tests);
- ``gpu paths``: the GPU-marked tests of tests/unit/test_gpu_paths.py, each with its outcome
  (``scaletrain run`` with NCCL, the Checkpointer on CUDA state, ``--procs-per-gpu`` with MPS,
  the Monitor with NVML);
- ``setup vs loop``: one bf16 training step of the small GPT through ``scaletrain.setup``
  (ddp, zero3) against the same step written by hand, interleaved: the median ratio of 7
  rounds and its spread (goal <= 1.01x; at world 1 it should read 1.00 +- the spread);
- ``mfu``: the small GPT of examples/strategies_gpt.py, bf16, eager and ``torch.compile``d,
  model FLOP utilisation against the card's peak (6 x parameters x tokens per step);
- ``bench comm``: ``scaletrain bench comm --nproc 1`` on the card. At world 1 a collective
  moves nothing between GPUs: this shows the call overhead and on-card copy rate, not a link;
- ``checkpoint``: save/load GB/s of GPU-resident state, replicated (sync and async, with the
  training pause of async: the first save, which pins its staging buffers, and the second) and sharded (zero3 at world 1);
- ``device sampler``: the Monitor's NVML/AMD SMI sampler reading utilisation and memory while
  the card multiplies matrices; ``sampler cost``: microseconds per reading;
- ``doctor``: ``scaletrain doctor --json`` (NCCL/RCCL reachable, the card seen);
- ``model vs torchtitan``: benchmarks/llama.py, the ~1B Llama-style decoder by hand (FSDP2),
  through ``setup`` (zero3, ddp) and by torchtitan's trainer where installed: tokens/s, MFU,
  peak memory (the toy model on the CPU);
- ``checkpoint vs dcp``: benchmarks/checkpoint_dcp.py, saves and loads of 0.3, 1 and 4 GiB of
  GPU state against raw ``torch.save`` and raw DCP, with the disk's ``dd`` floor (sizes / 64 on
  the CPU). These two run on the CPU as well, so CI keeps them working.

``--only "model vs torchtitan,checkpoint vs dcp"`` runs those steps alone (``environment`` always).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from interleave import interleaved  # noqa: E402 - after the paths it needs

Result = dict[str, Any]
NO_GPU = "no GPU"


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _run(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def _gpt(dim: int = 512, layers: int = 8, seq: int = 512, vocab: int = 8192) -> tuple[Any, Any]:
    """The example's GPT at a size that keeps an H100 busy, and a batch of token ids."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("strategies_gpt", REPO / "examples" / "strategies_gpt.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.GPT(vocab=vocab, seq=seq, dim=dim, heads=8, layers=layers).cuda()
    batch = torch.randint(0, vocab, (16, seq), device="cuda")
    return model, batch


def _step_time(step: Callable[[], Any], steps: int = 20, warmup: int = 5) -> float:
    """Median seconds of ``step`` (synchronised each time: the figure is the GPU's step)."""
    import torch

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _loss(model: Any, batch: Any) -> Any:
    import torch.nn.functional as F

    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))


# ---------------------------------------------------------------------------- the steps
def environment() -> Result:
    import torch

    out: Result = {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}
    if not _gpu():
        return {**out, "status": "ok", "device": NO_GPU}
    from scaletrain.observe.flops import peak_flops

    name = torch.cuda.get_device_name(0)
    return {**out, "status": "ok", "device": name, "count": torch.cuda.device_count(),
            "peak_bf16_tflops": (peak_flops(name) or 0) / 1e12 or None}


GPU_PATHS = "tests/unit/test_gpu_paths.py"


def gpu_tests() -> Result:
    if not _gpu():
        return {"status": "skipped", "reason": NO_GPU}
    proc = _run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/unit",
                 f"--ignore={GPU_PATHS}"], 240)
    return {"status": "ok" if proc.returncode == 0 else "failed", "summary": _last_line(proc.stdout)}


def gpu_paths() -> Result:
    if not _gpu():
        return {"status": "skipped", "reason": NO_GPU}
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "paths.xml"
        proc = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", GPU_PATHS,
                     f"--junitxml={xml}"], 360)
        outcomes = junit_outcomes(xml.read_text()) if xml.exists() else {}
    if not outcomes:
        return {"status": "failed", "error": _last_line(proc.stdout + proc.stderr)}
    return {"status": "ok" if proc.returncode == 0 else "failed", **outcomes}


def junit_outcomes(xml: str) -> dict[str, str]:
    """Each test of a pytest JUnit XML report: "passed", "failed: <message>" or "skipped: <reason>"."""
    import xml.etree.ElementTree as ET

    out: dict[str, str] = {}
    for case in ET.fromstring(xml).iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                word = "skipped" if child.tag == "skipped" else "failed"
                outcome = f"{word}: {(child.get('message') or '').splitlines()[0][:120]}" if child.get("message") \
                    else word
        out[case.get("name", "?")] = outcome
    return out


def setup_vs_loop() -> Result:
    if not _gpu():
        return {"status": "skipped", "reason": NO_GPU}
    import torch

    import scaletrain

    scaletrain.init(device="cuda")
    model, batch = _gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def by_hand() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = _loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    steps: dict[str, Callable[[], None]] = {"hand": by_hand}
    for strategy in ("ddp", "zero3"):
        m, b = _gpt()
        wrapped, o = scaletrain.setup(m, torch.optim.AdamW(m.parameters(), lr=1e-4), strategy=strategy,
                                      precision="bf16")

        def ours(wrapped: Any = wrapped, o: Any = o, b: Any = b) -> None:
            loss = _loss(wrapped, b)
            scaletrain.backward(loss)
            o.step()
            o.zero_grad(set_to_none=True)

        steps[strategy] = ours
    # a block: the median of 10 synchronised steps, after 2 unmeasured ones
    blocks = {name: (lambda step=step: _step_time(step, steps=10, warmup=2)) for name, step in steps.items()}
    return {"status": "ok", **interleaved(blocks, "hand")}


def mfu() -> Result:
    if not _gpu():
        return {"status": "skipped", "reason": NO_GPU}
    import torch

    from scaletrain.observe.flops import peak_flops

    peak = peak_flops(torch.cuda.get_device_name(0))
    out: Result = {"status": "ok", "peak_bf16_tflops": peak / 1e12 if peak else None}
    for compiled in (False, True):
        model, batch = _gpt()
        params = sum(p.numel() for p in model.parameters())
        run = torch.compile(model) if compiled else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step() -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = _loss(run, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        t = _step_time(step, warmup=8 if compiled else 5)
        flops = 6 * params * batch[:, :-1].numel() / t
        key = "compiled" if compiled else "eager"
        out[f"{key}_ms"] = round(t * 1e3, 3)
        out[f"{key}_tflops"] = round(flops / 1e12, 1)
        out[f"{key}_mfu"] = round(flops / peak, 4) if peak else None
    return out


def bench_comm() -> Result:
    if not _gpu():
        return {"status": "skipped", "reason": NO_GPU}
    with tempfile.TemporaryDirectory() as tmp:
        proc = _run([sys.executable, "-m", "scaletrain", "bench", "comm", "--nproc", "1", "--sizes", "1M..1G:8",
                     "--ops", "all_reduce", "--out", tmp], 150)
        if proc.returncode != 0:
            return {"status": "failed", "error": _last_line(proc.stderr or proc.stdout)}
        report = json.loads((Path(tmp) / "comm.json").read_text())
    return {"status": "ok", "note": "world 1: call overhead and on-card copies, no link", "report": report}


def checkpoint() -> Result:
    if not _gpu():
        return {"status": "skipped", "reason": NO_GPU}
    import torch

    import scaletrain

    scaletrain.init(device="cuda")
    gb = 1.0
    out: Result = {"status": "ok", "state_gb": gb}
    layers = [torch.nn.Linear(8192, 8192, bias=False) for _ in range(int(gb * 2**30 / (8192 * 8192 * 4)))]
    for kind, strategy in (("replicated", "ddp"), ("sharded", "zero3")):
        model = torch.nn.Sequential(*layers).cuda()
        wrapped, _ = scaletrain.setup(model, None, strategy=strategy) if strategy == "zero3" else (model, None)
        for mode in ("sync", "async"):
            with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
                ck = scaletrain.Checkpointer(tmp, keep=1, async_save=mode == "async", exit_on_stop=False)
                pauses = []
                for step in (1, 2):  # the first async save pins its buffers, the second reuses them
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    ck.save(step, {"model": wrapped})
                    pauses.append(time.perf_counter() - t0)
                    ck.wait()
                    save = time.perf_counter() - t0
                pause = pauses[1]
                t0 = time.perf_counter()
                ck.load_latest({"model": wrapped})
                torch.cuda.synchronize()
                load = time.perf_counter() - t0
                ck.close()
            out[f"{kind}_{mode}_save_gbps"] = round(gb / save, 2)
            out[f"{kind}_{mode}_load_gbps"] = round(gb / load, 2)
            if mode == "async":
                out[f"{kind}_async_pause_s"] = round(pause, 3)            # pinned buffers reused
                out[f"{kind}_async_first_pause_s"] = round(pauses[0], 3)  # pinning them included
    return out


def device_sampler() -> Result:
    if not _gpu():
        return {"status": "skipped", "reason": NO_GPU}
    import torch

    from scaletrain.observe.devices import node_sampler

    sampler = node_sampler("cuda:0", interval_s=0.2)
    backend = sampler._backend  # the NVML / AMD SMI reader itself, for its cost per reading
    if not sampler.available or backend is None:
        return {"status": "skipped", "reason": f"no device backend: {sampler.reason}"}
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + 3.0
    while time.perf_counter() < end:
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    busy = sampler.snapshot()
    sampler.close()
    t0 = time.perf_counter()
    n = 0
    while n < 200:
        backend.read()
        n += 1
    cost_us = (time.perf_counter() - t0) / n * 1e6
    return {"status": "ok", "backend": getattr(backend, "name", type(backend).__name__), "while_busy": busy,
            "util_pct": _util(busy), "read_cost_us": round(cost_us, 1)}


def _util(snapshot: dict[str, Any]) -> float | None:
    """Device 0's mean utilisation in a sampler snapshot (the figure the table shows)."""
    devices = snapshot.get("devices") or {}
    first = devices.get("0") or next(iter(devices.values()), {})
    return first.get("util_pct")


def doctor() -> Result:
    if not _gpu():
        return {"status": "skipped", "reason": NO_GPU}
    proc = _run([sys.executable, "-m", "scaletrain", "doctor", "--json"], 120)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return {"status": "failed", "error": _last_line(proc.stderr or proc.stdout)}
    return {"status": "ok" if proc.returncode == 0 else "failed", "report": report}


# ------------------------------------------------- the model and checkpoint benchmarks (issue 30)
# They run at toy size on the CPU too (so CI keeps them working); each in its own process, under
# its own time limit and never past the run's budget (DEADLINE, set by main).
DEADLINE: float | None = None


def _benchmark(script: str, result: str, args: list[str], limit_s: float) -> tuple[Result, Any]:
    """Run benchmarks/``script`` with ``args`` into a temporary folder; (status, its JSON)."""
    if DEADLINE is not None:
        limit_s = min(limit_s, DEADLINE - time.perf_counter())
    if limit_s < 30:
        return {"status": "skipped", "reason": "time budget spent"}, None
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        cmd = [sys.executable, str(REPO / "benchmarks" / script), "--out", tmp, *args]
        try:
            proc = _run(cmd, limit_s)
            failed = proc.returncode != 0
            tail = _last_line(proc.stderr or proc.stdout)
        except subprocess.TimeoutExpired:
            failed, tail = True, f"cut at {limit_s:.0f} s (the rows measured by then are kept)"
        path = Path(tmp) / result
        doc = json.loads(path.read_text()) if path.is_file() else None
    if doc is None:
        return {"status": "failed", "error": tail or "no result"}, None
    status: Result = {"status": "ok"} if not failed else {"status": "ok", "note": tail}
    return status, doc


def model_vs_torchtitan() -> Result:
    """benchmarks/llama.py: the 1b decoder by hand (FSDP2), through setup (zero3, ddp) and by
    torchtitan, bf16, compiled, seq 2048, batch probed; the toy model on the CPU."""
    gpu = _gpu()
    if not gpu:
        from scaletrain.torch_features import fsdp_on_cpu

        if not fsdp_on_cpu():   # the hand-written loop and zero3 are FSDP2
            return {"status": "skipped", "reason": "FSDP2 on the CPU needs torch 2.7"}
    args = (["--seq", "2048", "--compile", "on", "--ac", "off", "--max-batch", "16", "--steps", "10",
             "--warmup", "3", "--repeats", "2", "--budget-s", "150"] if gpu else
            ["--device", "cpu", "--ac", "off", "--steps", "1", "--warmup", "1", "--repeats", "1"])
    out, doc = _benchmark("llama.py", "llama.json", args, 300 if gpu else 180)
    if doc is None:
        return out
    for row in doc["rows"]:
        key = row["variant"]
        if row["status"] != "ok":
            out[key] = row["status"]
            continue
        out[f"{key}_tokens_s"] = row["tokens_s"]
        out[f"{key}_mfu"] = row["mfu"]
        out[f"{key}_peak_gib"] = row["peak_gib"]
        if key != "hand":
            out[f"{key}_vs_hand"] = row["vs_hand"]
    out["batch"] = next((r["batch"] for r in doc["rows"] if r["status"] == "ok"), None)
    return {**out, "report": doc}


def checkpoint_vs_dcp() -> Result:
    """benchmarks/checkpoint_dcp.py: GPU state at 0.3, 1 and 4 GiB (the same / 64 on the CPU),
    ours against raw torch.save and raw DCP, the disk's dd floor in the same run."""
    gpu = _gpu()
    args = ["--reps", "3"] if gpu else ["--device", "cpu", "--reps", "2"]
    out, doc = _benchmark("checkpoint_dcp.py", "checkpoint_dcp.json", args, 300 if gpu else 180)
    if doc is None:
        return out
    for size in doc["sizes"]:
        tag = f"{size['gib']}GiB"
        out[f"{tag}_floor_s"] = size["floor_s"]
        out[f"{tag}_repl_save_s"] = size["cases"]["ours replicated"]["save_s"]
        out[f"{tag}_dcp_save_s"] = size["cases"]["dcp"]["save_s"]
        for key in ("replicated_save_vs_dcp", "sharded_save_vs_dcp", "replicated_load_vs_torch_load",
                    "sharded_load_vs_dcp"):
            out[f"{tag}_{key}"] = size[key]
    return {**out, "report": doc}


STEPS: dict[str, Callable[[], Result]] = {
    "environment": environment, "gpu tests": gpu_tests, "gpu paths": gpu_paths, "setup vs loop": setup_vs_loop,
    "mfu": mfu,
    "bench comm": bench_comm, "checkpoint": checkpoint, "device sampler": device_sampler, "doctor": doctor,
    "checkpoint vs dcp": checkpoint_vs_dcp, "model vs torchtitan": model_vs_torchtitan,
}


def _figures(result: Result) -> str:
    skip = {"status", "reason", "report", "while_busy"}
    parts = [f"{k}={v}" for k, v in result.items() if k not in skip and v is not None]
    return ", ".join(parts)


def markdown(doc: Result) -> str:
    """One table: step, status (with the reason when not ok), figures."""
    lines = [f"GPU acceptance run, {doc['date']}, {doc['host']}, {doc['device']}", "",
             "| step | status | figures |", "|---|---|---|"]
    for name, result in doc["steps"].items():
        status = result["status"] + (f": {result['reason']}" if result.get("reason") else "")
        if result.get("error"):
            status += f": {result['error']}"
        lines.append(f"| {name} | {status} | {_figures({k: v for k, v in result.items() if k != 'error'})} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu-check", help="folder for gpu_check.json and gpu_check.md")
    p.add_argument("--budget-s", type=float, default=540.0, help="skip the steps left once this is spent")
    p.add_argument("--only", default="", help="comma list of steps to run (environment always runs)")
    args = p.parse_args(argv)
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    unknown = only - set(STEPS)
    if unknown:
        p.error(f"unknown step(s) {', '.join(sorted(unknown))}; the steps: {', '.join(STEPS)}")
    start = time.perf_counter()
    global DEADLINE
    DEADLINE = start + args.budget_s
    steps: dict[str, Result] = {}
    for name, step in STEPS.items():
        if only and name != "environment" and name not in only:
            continue
        if time.perf_counter() - start > args.budget_s:
            steps[name] = {"status": "skipped", "reason": f"time budget of {args.budget_s:.0f} s spent"}
            continue
        t0 = time.perf_counter()
        try:
            steps[name] = step()
        except Exception as exc:  # noqa: BLE001 - one step's failure must not hide the others' figures
            steps[name] = {"status": "failed", "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        steps[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"gpu-check: {name}: {steps[name]['status']}", file=sys.stderr, flush=True)
    env = steps["environment"]
    doc: Result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "host": platform.node(), "device": env.get("device", NO_GPU), "steps": steps}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out / "gpu_check.md").write_text(markdown(doc))
    print(markdown(doc))
    return 1 if any(r["status"] == "failed" for r in steps.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
