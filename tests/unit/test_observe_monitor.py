"""Monitor and its sinks in one process: numbers against wall time, files readable by their tools."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from scaletrain.errors import UsageError
from scaletrain.observe.devices import THREAD_NAME, DeviceSampler, Sample, node_sampler, open_backend
from scaletrain.observe.monitor import Monitor
from scaletrain.runtime.env import Env


class FakeBackend:
    """Stands in for NVML: the node's devices at fixed utilisations."""

    name = "fake"

    def __init__(self, *utils: float) -> None:
        self.utils = utils
        self.reads = 0
        self.closed = False

    def read(self):
        self.reads += 1
        return {str(i): Sample(util_pct=u, mem_gb=1.0, power_w=100.0) for i, u in enumerate(self.utils)}

    def close(self):
        self.closed = True


def _sampler_threads() -> int:
    return sum(t.name == THREAD_NAME and t.is_alive() for t in threading.enumerate())


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
    """The file's records after the run's ``start`` line (tested on its own below)."""
    return [r for r in (json.loads(line) for line in path.read_text().splitlines()) if r["type"] != "start"]


def test_jsonl_throughput_matches_wall_time(tmp_path, no_gpu):  # peak memory: this process's RSS
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
    assert "pip install tensorboard" in err.value.hint and "tensorboard=False" in err.value.hint


def test_console_plain_lines_when_not_a_terminal(tmp_path):
    out = io.StringIO()
    mon = Monitor(None, total_steps=20, every=5, log_every=5, log_interval_s=0, device_sampler=None, stream=out)
    _loop(mon, 20, fetch_s=0.0, work_s=0.001)
    mon.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    progress = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split()[1] for ln in progress] == ["5/20", "10/20", "15/20", "20/20"]
    assert "ETA" in progress[0] and "samples/s" in progress[0]
    assert any("20 steps in" in ln for ln in lines)


def test_console_prints_the_total_step_wherever_it_falls_in_a_batch():
    from scaletrain.observe.records import StepBatch
    from scaletrain.observe.sinks import ConsoleSink
    from scaletrain.observe.steplog import StepColumns

    out = io.StringIO()
    sink = ConsoleSink(total=13, every=5, stream=out, bar=False)
    sink.write(StepBatch(StepColumns.build([0.01] * 16, [4] * 16, first=1), mem_gb=0.1, world_size=1))
    assert [ln.split()[1] for ln in out.getvalue().splitlines()] == ["5/13", "10/13", "13/13", "15/13"]


def test_idle_device_with_data_wait_flagged_with_hint(tmp_path):
    out = io.StringIO()
    fake = FakeBackend(12.0)
    mon = Monitor(tmp_path, every=4, device_sampler=fake, device_id="0", num_workers=2, stream=out,
                  sample_interval_s=0.005)
    _loop(mon, 8, fetch_s=0.01, work_s=0.002)
    summary = mon.close()
    assert fake.closed
    idle = [f for f in summary["findings"] if f["kind"] == "idle"]
    assert len(idle) == 1
    assert "12%" in idle[0]["message"] and "data loader" in idle[0]["message"]
    assert "GPU 0 of the node" in idle[0]["message"]
    assert summary["device_util"]["util_pct"] == 12.0 and summary["device_util"]["samples"] >= 1
    assert "num_workers (now 2)" in idle[0]["hint"] and "stage" in idle[0]["hint"]
    assert "HINT: raise the loader's num_workers" in out.getvalue()
    events = [r for r in _records(tmp_path / "metrics.jsonl") if r["type"] == "event"]
    assert events and events[0]["kind"] == "idle"


def test_busy_device_not_flagged(tmp_path):
    mon = Monitor(None, console=False, every=4, device_sampler=FakeBackend(95.0), device_id="0",
                  sample_interval_s=0.005)
    _loop(mon, 8, fetch_s=0.0, work_s=0.001)
    assert mon.close()["findings"] == []


def test_gpu_sampling_absent_is_reported_not_raised(no_gpu):
    no_gpu.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py missing: `import pynvml` fails
    backend, reason = open_backend("nvidia")
    assert backend is None and "nvidia-ml-py" in reason
    sampler = DeviceSampler(None, reason=reason)
    assert sampler.snapshot() == {"available": False, "reason": reason}
    gpu = node_sampler("cuda:0", vendor="nvidia")  # a GPU rank without NVML: unavailable, no thread
    assert gpu.overall() == {"available": False, "reason": reason} and _sampler_threads() == 0
    assert node_sampler("cpu").overall()["available"] is False
    mon = Monitor(None, console=False, every=2)  # "auto" on the CPU: unavailable, no thread
    _loop(mon, 3, fetch_s=0.0, work_s=0.0)
    util = mon.close()["device_util"]
    assert util["available"] is False and "CPU" in util["reason"]


def test_backend_failing_stops_sampling_not_training():
    class Flaky(FakeBackend):
        def read(self):
            if self.reads >= self.good:
                raise OSError("driver gone")
            return super().read()

    broken = Flaky(50.0)
    broken.good = 0  # the first reading fails: unavailable at once, no thread
    sampler = DeviceSampler(broken)
    assert sampler.snapshot() == {"available": False, "reason": "sampling stopped: OSError: driver gone"}
    assert broken.closed and sampler._thread is None
    flaky = Flaky(50.0)
    flaky.good = 1  # fails in the thread, on its second reading
    sampler = DeviceSampler(flaky, interval_s=0.01)
    sampler._thread.join(timeout=60)
    assert not sampler._thread.is_alive() and flaky.closed
    assert sampler.snapshot()["available"] is False  # stopped: no stale figures passed off as new
    assert sampler.overall()["devices"]["0"]["util_pct"] == 50.0  # what was read is kept
    sampler.close()


def test_only_the_lowest_local_rank_samples_the_node():
    fake0, fake1 = FakeBackend(90.0, 10.0), FakeBackend(90.0, 10.0)
    local0 = Monitor(None, console=False, device_sampler=fake0, device_id="0",
                     env=Env(rank=0, local_rank=0, world_size=2, local_world_size=2))
    local1 = Monitor(None, console=False, device_sampler=fake1, device_id="1",
                     env=Env(rank=1, local_rank=1, world_size=2, local_world_size=2))
    assert _sampler_threads() == 1 and fake0.reads == 1 and fake1.reads == 0
    assert local1.sampler is None
    snap = local0.sampler.snapshot()
    assert snap["devices"]["1"]["util_pct"] == 10.0 and snap["devices"]["0"]["util_pct"] == 90.0
    local1.close()
    local0.close()
    assert _sampler_threads() == 0 and fake0.closed and not fake1.closed


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


def test_steps_reach_the_file_within_flush_s_not_at_every(tmp_path):
    mon = Monitor(tmp_path, console=False, every=1000, flush_s=0.01, device_sampler=None)
    _loop(mon, 5, fetch_s=0.0, work_s=0.02)
    path = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 60  # the writer thread is asynchronous: wait for it, bounded
    while time.monotonic() < deadline and (not path.exists() or len(path.read_text().splitlines()) < 5):
        time.sleep(0.01)
    written = [r["step"] for r in _records(path)]
    assert written[:4] == [1, 2, 3, 4]  # before close() and long before the 1000-step exchange
    mon.close()
    assert [r["step"] for r in _records(path) if r["type"] == "step"] == [1, 2, 3, 4, 5]


def test_exit_without_close_writes_every_step(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from scaletrain.observe.monitor import Monitor
        mon = Monitor({str(tmp_path)!r}, console=False, every=1000, flush_s=3600, device_sampler=None)
        for i in range(7):
            mon.step(samples=4, loss=float(i))
        sys.exit(3)  # no close(): the atexit hook writes the buffered steps and the summary
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr
    recs = _records(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs if r["type"] == "step"] == list(range(1, 8))
    assert recs[3]["loss"] == 3.0 and recs[-1]["type"] == "summary" and recs[-1]["steps"] == 7


def test_exchanges_spaced_to_about_a_second_only_by_default():
    spaced = Monitor(None, console=False, device_sampler=None)  # every left out: 100, or ~1 s of steps
    exact = Monitor(None, console=False, device_sampler=None, every=100)
    for mon in (spaced, exact):
        mon.start()
        for _ in range(100):
            time.sleep(0.0005)  # steps of well under 10 ms
            mon.step(samples=1)
    # steps of ~1 ms (the median, under 10 ms even on a loaded machine): the next exchange comes
    # about a second later, more than 100 steps
    assert spaced._exchanged_at == 100 and spaced._next_exchange > 200
    assert exact._exchanged_at == 100 and exact._next_exchange == 200
    assert spaced.close()["steps"] == exact.close()["steps"] == 100


def test_each_run_starts_with_a_start_line_for_status_and_report(tmp_path, monkeypatch):
    # a requeued job's runs append to one file: each run's first line says where its steps begin
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    for restart, start_step in (("0", 0), ("1", 3)):
        monkeypatch.setenv("SLURM_RESTART_COUNT", restart)
        mon = Monitor(tmp_path, total_steps=9, console=False, device_sampler=None, start_step=start_step)
        for _ in range(3):
            mon.step(samples=2)
        mon.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    starts = [r for r in lines if r["type"] == "start"]
    assert [(s["start_step"], s["restart"], s["total_steps"], s["job_id"]) for s in starts] == \
        [(0, 0, 9, "4242"), (3, 1, 9, "4242")]
    assert [r["type"] for r in lines] == ["start", "step", "step", "step", "summary"] * 2
    assert all(isinstance(s["time"], float) and s["world_size"] == 1 for s in starts)


def test_the_summary_says_where_its_files_went(tmp_path):
    import io

    stream = io.StringIO()
    mon = Monitor(tmp_path / "run", console=True, stream=stream, device_sampler=None)
    for _ in range(3):
        mon.step(samples=4, loss=1.0)
    summary = mon.close()
    assert summary["run_dir"] == str(tmp_path / "run") and summary["files"] == ["metrics.jsonl", "summary.json"]
    assert f"files in {tmp_path / 'run'}: metrics.jsonl, summary.json" in stream.getvalue()
    assert (tmp_path / "run" / "summary.json").is_file() and (tmp_path / "run" / "metrics.jsonl").is_file()


def test_idle_finding_quotes_the_training_readings_and_is_printed_once(tmp_path):
    """NVML read 0% when the Monitor was made (nothing running yet), 8% while training: the
    finding says 8%, as the summary does, and the console prints it once, not again with the
    summary."""
    class Starting(FakeBackend):
        def read(self):
            sample = super().read()
            return sample if self.reads > 1 else {"0": Sample(util_pct=0.0, mem_gb=1.0)}

    out = io.StringIO()
    fake = Starting(8.0)
    mon = Monitor(tmp_path, every=4, device_sampler=fake, device_id="0", stream=out, sample_interval_s=0.005)
    _loop(mon, 12, fetch_s=0.003, work_s=0.009)
    summary = mon.close()
    [idle] = [f for f in summary["findings"] if f["kind"] == "idle"]
    assert "busy only 8%" in idle["message"] and summary["device_util"]["util_pct"] == 8.0
    assert out.getvalue().count("busy only") == 1
    assert "utilisation 8%" in out.getvalue()


def _batch(step_s: float, n: int, first: int = 1, start: float = 0.0):
    from scaletrain.observe.records import StepBatch
    from scaletrain.observe.steplog import StepColumns

    return StepBatch(StepColumns.build([step_s] * n, [4] * n, first=first, start=start), mem_gb=0.1, world_size=1)


def test_console_lines_in_a_batch_log_are_spaced_by_time():
    """3.5 ms steps (the H200 run wrote 378 lines in 16 s): a line at most every 30 s of the
    steps' own clock, across batches; steps of 5 s still get one every log_every steps."""
    from scaletrain.observe.sinks import ConsoleSink

    out = io.StringIO()
    sink = ConsoleSink(total=40_000, every=10, stream=out, bar=False, interval_s=30.0)
    sink.write(_batch(0.0035, 20_000))                      # 70 s
    sink.write(_batch(0.0035, 20_000, first=20_001, start=70.0))
    steps = [int(ln.split()[1].split("/")[0]) for ln in out.getvalue().splitlines()]
    # step 10, then the first tenth step 30 s after the line before, ..., and the last step
    assert steps == [10, 8590, 17170, 25750, 34330, 40_000]
    slow = io.StringIO()
    sink = ConsoleSink(total=None, every=10, stream=slow, bar=False, interval_s=30.0)
    sink.write(_batch(5.0, 35))
    assert [ln.split()[1] for ln in slow.getvalue().splitlines()] == ["10", "20", "30"]
    every = io.StringIO()     # 0: every log_every steps, as before
    ConsoleSink(total=None, every=10, stream=every, bar=False, interval_s=0).write(_batch(0.0035, 35))
    assert [ln.split()[1] for ln in every.getvalue().splitlines()] == ["10", "20", "30"]


def test_settings_are_one_config_object_checked_when_made():
    from scaletrain.observe.config import MonitorConfig

    config = MonitorConfig(total_steps=9, console=False, every=3, device_sampler=None)
    mon = Monitor(None, config, warmup=0)          # keywords set over the object
    assert (mon.config.total_steps, mon.config.warmup, mon.every) == (9, 0, 3)
    mon.close()
    with pytest.raises(UsageError, match="no setting 'log_evry'") as err:
        Monitor(None, log_evry=5)
    assert "log_every" in err.value.hint
    with pytest.raises(UsageError, match="Monitor: log_interval_s must be a finite number from 0 to 86400 \\(seconds\\), got -1"):
        MonitorConfig(log_interval_s=-1)


def test_a_run_shorter_than_the_sampling_interval_claims_no_utilisation():
    """The reading taken when the Monitor is made is a probe (the card idle before training):
    a run that ends before the next reading says so instead of quoting it."""
    out = io.StringIO()
    mon = Monitor(None, every=4, device_sampler=FakeBackend(0.0), device_id="0", stream=out,
                  sample_interval_s=3600)
    _loop(mon, 8, fetch_s=0.0, work_s=0.001)
    summary = mon.close()
    assert summary["device_util"]["samples"] == 0 and summary["findings"] == []
    assert "GPU 0: no reading taken while training" in out.getvalue()
