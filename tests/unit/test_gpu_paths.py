"""The GPU paths, where a GPU is (skipped elsewhere; `bash scripts/gpu-check.sh` runs them and
lists each in its table, step "gpu paths"):

- `scaletrain run` on one GPU with NCCL trains the README's example;
- the Checkpointer, sync and async, on CUDA state: a save whose payload and local tensors line
  up (the async staging overwrote the payload with the local tree), values bitwise equal on
  load, and an exact resume (the same parameters after two more steps, RNG included);
- `run --procs-per-gpu 2` (gloo + CUDA MPS) ends and leaves no MPS daemon;
- the Monitor with NVML: figures read while the card works, and an idle finding that quotes
  the utilisation and data wait the summary prints.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import scaletrain  # noqa: E402
from scaletrain.launch.mps import MPS_CONTROL  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cifar10_cnn.py"


def _scaletrain(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "scaletrain", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_run_trains_the_readme_example_on_one_gpu_with_nccl():
    proc = _scaletrain("run", "--nproc-per-node", "1", str(EXAMPLE), "--epochs", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "cuda:0 nccl" in out and "epoch 1/1 loss" in out


class _EvalState:
    """A per-rank object (an evaluation loader's shape: ``mode`` "eval" and a sampler) holding a
    CUDA tensor, so the save's local tree is on the GPU too and staged into buffers."""

    mode = "eval"
    sampler = None

    def __init__(self, t: "torch.Tensor") -> None:
        self.t = t

    def state_dict(self) -> dict:
        return {"t": self.t}

    def load_state_dict(self, sd: dict) -> None:
        self.t.copy_(sd["t"])


def _objects(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Dropout(0.2), torch.nn.Linear(64, 8)).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train(model, opt, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(16, 32, device="cuda")   # the CUDA RNG: restored by the load
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _flat(model, opt) -> list:
    return [p.detach().cpu().clone() for p in model.parameters()] + \
        [v.detach().cpu().clone() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]


def _bitwise(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
        for x, y in zip(a, b))


@pytest.mark.parametrize("async_save", [False, True])
def test_checkpointer_on_cuda_state_bitwise_with_lined_up_trees_and_exact_resume(tmp_path, async_save):
    model, opt = _objects(0)
    _train(model, opt, 3)
    # the payload's first tensor and the local tree's first (Python's RNG state) alike: 625 int64
    lined = torch.full((625,), 1_000_003, dtype=torch.int64, device="cuda")
    ev = _EvalState(torch.full((625,), 7, dtype=torch.int64, device="cuda"))
    ckpt = scaletrain.Checkpointer(tmp_path / "ck", keep=3, async_save=async_save, exit_on_stop=False)
    for step in (1, 2, 3):
        lined.fill_(1_000_003 * step)
        ckpt.save(step, {"model": model, "optimizer": opt, "lined_up": lined, "eval": ev})
        saved = _flat(model, opt)
        lined.fill_(-1)   # training goes on changing everything the save copied
        ev.t.fill_(-1)
        _train(model, opt, 2)
        ckpt.wait()
        ev.t.fill_(7)
    after = _flat(model, opt)
    ckpt.close()

    fresh, fresh_opt = _objects(1)
    back = _EvalState(torch.zeros(625, dtype=torch.int64, device="cuda"))
    state = {"model": fresh, "optimizer": fresh_opt, "lined_up": torch.zeros(625, dtype=torch.int64), "eval": back}
    loader = scaletrain.Checkpointer(tmp_path / "ck", keep=3, exit_on_stop=False)
    assert loader.load_latest(state) == 3
    assert torch.equal(state["lined_up"].cpu(), torch.full((625,), 3_000_009, dtype=torch.int64))
    assert torch.equal(back.t.cpu(), torch.full((625,), 7, dtype=torch.int64))
    assert _bitwise(_flat(fresh, fresh_opt), saved)
    _train(fresh, fresh_opt, 2)        # the same two steps, the same RNG: the same numbers
    assert _bitwise(_flat(fresh, fresh_opt), after)
    loader.close()


def _mps_daemons() -> list[int]:
    """Our user's MPS control daemons and servers started for a scaletrain run."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if comm.startswith(MPS_CONTROL[:15]) and b"scaletrain_mps_" in env:
            found.append(int(pid))
    return found


@pytest.mark.skipif(shutil.which(MPS_CONTROL) is None, reason=f"needs {MPS_CONTROL} (CUDA MPS)")
def test_procs_per_gpu_with_mps_ends_and_leaves_no_daemon():
    """It trained its epoch and never ended (a 60 s timeout killed it): now it ends, within the
    grace period of the daemon's quit, and no daemon of ours is left."""
    before = set(_mps_daemons())
    proc = _scaletrain("run", "--procs-per-gpu", "2", str(EXAMPLE), "--epochs", "1", timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "started the MPS daemon" in out and "epoch 1/1 loss" in out
    deadline = time.monotonic() + 10
    while set(_mps_daemons()) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(_mps_daemons()) - before


def test_monitor_with_nvml_reads_the_card_and_its_idle_finding_agrees_with_the_summary(tmp_path):
    pytest.importorskip("pynvml", reason="needs nvidia-ml-py (the monitor extra)")
    from scaletrain.observe.monitor import Monitor

    env = scaletrain.init()       # the Monitor samples the device of this process's Env
    try:
        _busy_then_idle(Monitor, env)
    finally:
        scaletrain.shutdown()


def _busy_then_idle(Monitor, env) -> None:
    a = torch.randn(4096, 4096, device="cuda")
    busy = Monitor(None, console=False, every=10, sample_interval_s=0.05, env=env)
    for _ in range(60):            # matrix products back to back: a busy card
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
        busy.step(samples=1)
    summary = busy.close()
    util = summary["device_util"]
    assert util["available"] and util["samples"] >= 1 and util["util_pct"] >= 50, util
    assert not [f for f in summary["findings"] if f["kind"] == "idle"]

    def slow_batches():
        for _ in range(60):
            time.sleep(0.02)          # a slow loader: the card waits
            yield 1

    idle = Monitor(None, console=False, every=10, sample_interval_s=0.05, env=env)
    for b in idle.data(slow_batches()):
        (a @ a).sum().item()
        idle.step(samples=b)
    summary = idle.close()
    found = [f for f in summary["findings"] if f["kind"] == "idle"]
    assert found and "data loader" in found[0]["message"], summary
    assert summary["device_util"]["util_pct"] < 30
