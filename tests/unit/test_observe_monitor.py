"""Monitor and its sinks in one process: numbers against wall time, files readable by their tools."""

from __future__ import annotations

import io
import json
import time

import pytest

from scaletrain.errors import UsageError
from scaletrain.observe.devices import DeviceSampler, open_backend, sampler_for_device
from scaletrain.observe.monitor import Monitor


class FakeSampler:
    """Stands in for NVML: a fixed utilisation per snapshot."""

    def __init__(self, util: float) -> None:
        self.util = util
        self.closed = False

    def snapshot(self):
        return {"available": True, "util_pct": self.util, "mem_gb": 1.0, "power_w": 100.0, "samples": 3}

    def overall(self):
        return self.snapshot()

    def close(self):
        self.closed = True


def _loop(monitor: Monitor, steps: int, *, fetch_s: float, work_s: float, batch: int = 8) -> float:
    def batches():
        for _ in range(steps):
            time.sleep(fetch_s)
            yield batch

    start = time.perf_counter()
    monitor.start()
    for i, b in enumerate(monitor.data(batches())):
        time.sleep(work_s)
        monitor.step(samples=b, loss=1.0 / (i + 1), lr=0.1)
    return time.perf_counter() - start


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_throughput_matches_wall_time(tmp_path):
    mon = Monitor(tmp_path, total_steps=30, console=False, every=7, warmup=0, device_sampler=None)
    wall = _loop(mon, 30, fetch_s=0.004, work_s=0.006)
    summary = mon.close()
    recs = _records(tmp_path / "metrics.jsonl")
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 31))
    # throughput from the records against the wall clock of the loop: within 10%
    total_time = sum(r["step_s"] for r in steps)
    assert total_time == pytest.approx(wall, rel=0.10)
    samples = sum(r["samples"] for r in steps)
    assert summary["samples_per_s"] == pytest.approx(samples / wall, rel=0.10)
    for r in steps:
        assert r["samples_per_s"] == pytest.approx(r["samples"] / r["step_s"])
    # 4 ms of every ~10 ms step is spent blocked on the loader
    waits = [r["data_wait_frac"] for r in steps]
    assert 0.2 < sum(waits) / len(waits) < 0.65
    assert steps[2]["loss"] == pytest.approx(1 / 3) and steps[0]["lr"] == 0.1
    assert recs[-1]["type"] == "summary" and recs[-1]["steps"] == 30
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 30
    assert summary["peak_mem_gb"] > 0.01  # RSS of this Python process


def test_tensorboard_events_readable_by_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    mon = Monitor(tmp_path, console=False, tensorboard=True, every=5, device_sampler=None)
    _loop(mon, 12, fetch_s=0.0, work_s=0.001)
    mon.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "perf/step_time_s", "perf/samples_per_s", "extra/lr"} <= set(tags)
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 13))
    assert loss[3].value == pytest.approx(1 / 4)


def test_tensorboard_missing_gives_hint(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_tb(name, *a, **k):
        if name.startswith(("tensorboard", "torch.utils.tensorboard")):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tb)
    with pytest.raises(UsageError) as err:
        Monitor(tmp_path, console=False, tensorboard=True, device_sampler=None)
    assert "scaletrain[monitor]" in err.value.hint


def test_console_plain_lines_when_not_a_terminal(tmp_path):
    out = io.StringIO()
    mon = Monitor(None, total_steps=20, every=5, log_every=5, device_sampler=None, stream=out)
    _loop(mon, 20, fetch_s=0.0, work_s=0.001)
    mon.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    progress = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split()[1] for ln in progress] == ["5/20", "10/20", "15/20", "20/20"]
    assert "ETA" in progress[0] and "samples/s" in progress[0]
    assert any("20 steps in" in ln for ln in lines)


def test_idle_device_with_data_wait_flagged_with_hint(tmp_path):
    out = io.StringIO()
    fake = FakeSampler(util=12.0)
    mon = Monitor(tmp_path, every=4, device_sampler=fake, num_workers=2, stream=out)
    _loop(mon, 8, fetch_s=0.01, work_s=0.002)
    summary = mon.close()
    assert fake.closed
    idle = [f for f in summary["findings"] if f["kind"] == "idle"]
    assert len(idle) == 1
    assert "12%" in idle[0]["message"] and "data loader" in idle[0]["message"]
    assert "num_workers (now 2)" in idle[0]["hint"] and "stage" in idle[0]["hint"]
    assert "HINT: raise the loader's num_workers" in out.getvalue()
    events = [r for r in _records(tmp_path / "metrics.jsonl") if r["type"] == "event"]
    assert events and events[0]["kind"] == "idle"


def test_busy_device_not_flagged(tmp_path):
    mon = Monitor(None, console=False, every=4, device_sampler=FakeSampler(util=95.0))
    _loop(mon, 8, fetch_s=0.0, work_s=0.001)
    assert mon.close()["findings"] == []


def test_gpu_sampling_absent_is_reported_not_raised():
    backend, reason = open_backend("nvidia", 0)  # no NVIDIA driver on this machine
    assert backend is None and reason
    sampler = DeviceSampler(None, reason=reason)
    assert sampler.snapshot() == {"available": False, "reason": reason}
    assert sampler_for_device("cpu").overall()["available"] is False
    mon = Monitor(None, console=False, every=2)  # "auto" on the CPU: unavailable, no thread
    _loop(mon, 3, fetch_s=0.0, work_s=0.0)
    assert mon.close()["device_util"]["available"] is False


def test_bad_arguments_are_usage_errors():
    with pytest.raises(UsageError):
        Monitor(None, every=0, device_sampler=None)
    with pytest.raises(UsageError):
        Monitor(None, total_steps=0, device_sampler=None)


def test_exception_in_loop_keeps_records_and_closes(tmp_path):
    with pytest.raises(RuntimeError):
        with Monitor(tmp_path, console=False, every=50, device_sampler=None) as mon:
            _loop(mon, 7, fetch_s=0.0, work_s=0.0)
            raise RuntimeError("boom")
    recs = _records(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs if r["type"] == "step"] == list(range(1, 8))
    assert recs[-1]["type"] == "summary"


def test_flop_count_and_mfu(tmp_path):
    import torch

    from scaletrain.observe.flops import count_train_flops, peak_flops

    layer = torch.nn.Linear(32, 16, bias=False)
    flops = count_train_flops(layer, torch.randn(8, 32))
    assert flops == 2 * (2 * 8 * 32 * 16)  # forward 2*b*i*o; backward: the weight gradient (input needs none)
    assert layer.weight.grad is None
    assert peak_flops("NVIDIA A100-SXM4-40GB") == 312e12 and peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("AMD Instinct MI250X") == 191.5e12 and peak_flops("some CPU") is None
    mon = Monitor(tmp_path, console=False, every=5, warmup=0, device_sampler=None,
                  flops_per_sample=1e6, peak_flops=1e9)
    _loop(mon, 5, fetch_s=0.0, work_s=0.01, batch=8)
    summary = mon.close()
    steps = [r for r in _records(tmp_path / "metrics.jsonl") if r["type"] == "step"]
    for r in steps:
        assert r["mfu"] == pytest.approx(1e6 * 8 / r["step_s"] / 1e9)
    assert summary["mfu"] == pytest.approx(1e6 * summary["samples_per_s_per_device"] / 1e9)
