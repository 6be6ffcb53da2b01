"""The JSONL lines of a step batch: the fast template and the json path write the same records."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaletrain.observe.records import StepBatch
from scaletrain.observe.steplog import StepColumns

finite = st.floats(min_value=1e-9, max_value=1e6, allow_nan=False)
losses = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10))


def _cols(rows, t0=0.0):
    """Columns from (step_s, samples, loss, wait[, tokens, extra]) rows, as Monitor.step buffers them."""
    rows = [(*r, None, None)[:6] for r in rows]
    return StepColumns.build([r[0] for r in rows], [r[1] for r in rows], start=t0 + 0.25, t0=t0,
                             losses=[r[2] for r in rows], waits=[r[3] for r in rows],
                             tokens=[r[4] for r in rows], extras=[r[5] for r in rows])


def _same(fast: dict, slow: dict) -> None:
    assert list(fast) == list(slow)
    for key, value in slow.items():
        if isinstance(value, float):
            assert fast[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
        else:
            assert fast[key] == value, key


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(finite, st.integers(0, 4096), losses, st.floats(0, 10)), min_size=1, max_size=5),
       st.integers(1, 64), st.floats(0.0, 100.0))
def test_fast_lines_equal_json_records(rows, world, mem):
    batch = StepBatch(_cols(rows), mem_gb=mem, world_size=world)
    lines = batch.lines().splitlines()
    assert len(lines) == len(rows)
    for i, line in enumerate(lines):
        fast = json.loads(line)  # valid JSON: no NaN/Infinity tokens
        slow = {"type": "step", **batch.record(i)}
        if isinstance(slow["loss"], float) and not math.isfinite(slow["loss"]):
            slow["loss"] = None
        _same(fast, slow)


def test_tensor_losses_tokens_mfu_and_extras():
    import torch

    cols = _cols([(0.25, 8, torch.tensor(2.5), 0.05, 1000, {"lr": 0.1, "g": torch.tensor(3.0)}),
                  (0.25, 8, torch.tensor([1.5]), 0.0)])
    batch = StepBatch(cols, mem_gb=1.5, world_size=2, mfu_scale=1e-3)
    first, second = (json.loads(line) for line in batch.lines().splitlines())
    assert first["t"] == pytest.approx(0.5) and second["t"] == pytest.approx(0.75)
    assert first["loss"] == 2.5 and first["tokens_per_s"] == 2 * 1000 / 0.25 and first["lr"] == 0.1
    assert first["g"] == 3.0 and first["mfu"] == pytest.approx(1e-3 * 8 / 0.25)
    assert first["data_wait_frac"] == pytest.approx(0.2) and first["samples_per_s"] == 64.0
    assert second["loss"] == 1.5 and "tokens" not in second
    assert batch.record(1)["samples_per_s_per_device"] == 32.0


def test_jsonl_every_writes_each_nth_step_and_converts_only_their_losses():
    class Loss:
        """A loss that counts its conversions (a tensor's .item() synchronises a GPU)."""
        calls = 0

        def __init__(self, v):
            self.v = v

        def item(self):
            Loss.calls += 1
            return self.v

    steps = _cols([(0.01, 8, Loss(float(i)), 0.002) for i in range(1, 21)])
    every = StepBatch(steps, mem_gb=0.5, world_size=2).lines()
    Loss.calls = 0
    tenth = StepBatch(steps, mem_gb=0.5, world_size=2).lines(10)
    assert Loss.calls == 2
    full = [json.loads(x) for x in every.splitlines()]
    assert [json.loads(x) for x in tenth.splitlines()] == [r for r in full if r["step"] % 10 == 0]
    assert [r["step"] for r in map(json.loads, tenth.splitlines())] == [10, 20]


def test_monitor_jsonl_every(tmp_path):
    from scaletrain.observe.monitor import Monitor

    with Monitor(tmp_path, console=False, device_sampler=None, jsonl_every=4) as monitor:
        for _ in range(10):
            monitor.step(samples=2, loss=1.0)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["type"] == "step"] == [4, 8]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 10          # the summary still counts every step


def _steps(n: int, step_s: float) -> StepColumns:
    return _cols([(step_s, 8, 1.0, 0.0)] * n)


@pytest.mark.parametrize("step_s, stride", [(0.00025, 20), (0.001, 10), (0.004, 2), (0.005, 2),
                                            (0.01, 1), (0.2, 1), (1e-6, 10_000)])
def test_spaced_lines_by_default(tmp_path, step_s, stride):
    """Left out, jsonl_every spaces lines ~10 ms apart after 100 dense steps: a round stride."""
    from scaletrain.observe.records import spaced_every
    from scaletrain.observe.sinks import JsonlSink

    steps = _steps(300, step_s)
    assert spaced_every(steps) == stride
    sink = JsonlSink(tmp_path / "m.jsonl")  # the Monitor's default
    sink.write(StepBatch(steps, mem_gb=0.5, world_size=1))
    sink.close({})
    written = [json.loads(x)["step"] for x in (tmp_path / "m.jsonl").read_text().splitlines()[:-1]]
    assert written == [s for s in range(1, 301) if s <= 100 or s % stride == 0]


def test_monitor_keeps_only_the_losses_its_lines_show(tmp_path, monkeypatch):
    """Past the dense start, the Monitor drops at step() the losses of steps no sink shows (so
    the training thread frees them), and every JSONL line still has its loss."""
    import itertools

    import scaletrain.observe.monitor as monitor_module
    from scaletrain.observe.monitor import Monitor
    from scaletrain.observe.records import loss_stride

    assert loss_stride(20, 10) == 10 and loss_stride(20, None) == 20 and loss_stride(None, 10) == 10
    clock = itertools.count()
    monkeypatch.setattr(monitor_module.time, "perf_counter", lambda: next(clock) * 0.00025)  # 0.25 ms steps
    mon = Monitor(tmp_path, console=False, device_sampler=None, flush_s=0.05)  # a hand-over each 200 steps
    handed = []
    write = mon._writer.write
    monkeypatch.setattr(mon._writer, "write", lambda batch: handed.append(batch) or write(batch))
    for i in range(1, 1001):
        mon.step(samples=1, loss=float(i))
    assert mon._line_every == 20 and mon._loss_every == 20
    mon.close()
    kept = {batch.cols.first + i: batch.cols.row(i)[5] is not None for batch in handed for i in range(len(batch))}
    assert [n for n in range(401, 1001) if kept[n]] == list(range(420, 1001, 20))
    assert all(kept[n] for n in range(1, 101))
    steps = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["type"] == "step"]
    assert [s["step"] for s in steps] == [s for s in range(1, 1001) if s <= 100 or s % 20 == 0]
    assert all(s["loss"] == float(s["step"]) for s in steps)
