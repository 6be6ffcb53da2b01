"""The JSONL lines of a step batch: the fast template and the json path write the same records."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaletrain.observe.records import StepBatch

finite = st.floats(min_value=1e-9, max_value=1e6, allow_nan=False)
losses = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10))


def _raw(step, t, step_s, samples, loss, wait, tokens=None, extra=None):
    return (step, t, step_s, samples, tokens, loss, wait, None, extra)  # as Monitor.step buffers it


def _same(fast: dict, slow: dict) -> None:
    assert list(fast) == list(slow)
    for key, value in slow.items():
        if isinstance(value, float):
            assert fast[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
        else:
            assert fast[key] == value, key


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(finite, finite, st.integers(0, 4096), losses, st.floats(0, 10)), min_size=1, max_size=5),
       st.integers(1, 64), st.floats(0.0, 100.0))
def test_fast_lines_equal_json_records(rows, world, mem):
    steps = [_raw(i + 1, t, step_s, samples, loss, wait) for i, (t, step_s, samples, loss, wait) in enumerate(rows)]
    batch = StepBatch(steps, mem_gb=mem, world_size=world)
    lines = batch.lines().splitlines()
    assert len(lines) == len(steps)
    for i, line in enumerate(lines):
        fast = json.loads(line)  # valid JSON: no NaN/Infinity tokens
        slow = {"type": "step", **batch.record(i)}
        if isinstance(slow["loss"], float) and not math.isfinite(slow["loss"]):
            slow["loss"] = None
        _same(fast, slow)


def test_tensor_losses_tokens_mfu_and_extras():
    import torch

    steps = [_raw(1, 0.5, 0.25, 8, torch.tensor(2.5), 0.05, tokens=1000, extra={"lr": 0.1, "g": torch.tensor(3.0)}),
             _raw(2, 0.75, 0.25, 8, torch.tensor([1.5]), 0.0)]
    batch = StepBatch(steps, mem_gb=1.5, world_size=2, mfu_scale=1e-3)
    first, second = (json.loads(line) for line in batch.lines().splitlines())
    assert first["loss"] == 2.5 and first["tokens_per_s"] == 2 * 1000 / 0.25 and first["lr"] == 0.1
    assert first["g"] == 3.0 and first["mfu"] == pytest.approx(1e-3 * 8 / 0.25)
    assert first["data_wait_frac"] == pytest.approx(0.2) and first["samples_per_s"] == 64.0
    assert second["loss"] == 1.5 and "tokens" not in second
    assert batch.record(1)["samples_per_s_per_device"] == 32.0
