"""Hostile input to the Monitor (issue 22): a folder it cannot write, a full disk at close(),
a loss that is not one number, a negative sample count. Each is one line, never a traceback
from deep inside, and a full disk never ends the training."""

from __future__ import annotations

import errno
import json
import os
import warnings

import numpy as np
import pytest
import torch

import scaletrain.observe.monitor as monitor_module
from scaletrain.errors import UsageError
from scaletrain.observe.inputs import MonitorWriteWarning
from scaletrain.observe.monitor import Monitor


def _monitor(run_dir, **kw):
    return Monitor(run_dir, console=False, device_sampler=None, **kw)


def test_run_dir_that_is_a_file(tmp_path):
    target = tmp_path / "metrics"
    target.write_text("not a folder")
    with pytest.raises(UsageError, match="exists and is not a folder") as info:
        _monitor(target)
    assert "\n" not in str(info.value) and info.value.hint


def test_run_dir_that_cannot_be_created(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="cannot create .*file/run") as info:
        _monitor(tmp_path / "file" / "run")
    assert "run_dir=None" in info.value.hint


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_run_dir_read_only(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(UsageError, match="cannot write in"):
            _monitor(folder)
        with pytest.raises(UsageError, match="cannot create"):
            _monitor(folder / "run")
    finally:
        folder.chmod(0o700)


def test_full_disk_at_close_warns_once_and_returns(tmp_path, monkeypatch):
    mon = _monitor(tmp_path)
    sink = mon.sinks[0]
    sink._fh.close()
    sink._fh = open("/dev/full", "a", encoding="utf-8")  # every flush: ENOSPC

    def no_space(*_args, **_kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(monitor_module, "atomic_write", no_space)
    for _ in range(5):
        mon.step(samples=2, loss=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = mon.close()
    ours = [w for w in caught if issubclass(w.category, MonitorWriteWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "No space left on device" in str(ours[0].message) and "training goes on" in str(ours[0].message)
    assert summary["steps"] == 5 and summary["total_samples"] == 10


def test_full_disk_during_training_warns_at_the_next_hand_over(tmp_path):
    mon = _monitor(tmp_path, flush_s=1e-9)
    sink = mon.sinks[0]
    sink._fh.close()
    sink._fh = open("/dev/full", "a", encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon.step(samples=1)
        mon._writer._queue.put(("event", {"note": "sync"}))  # nothing to wait on but the thread
        for _ in range(200):
            if mon._writer.error is not None:
                break
            mon._writer._thread.join(0.01)
        for _ in range(3):
            mon.step(samples=1)
        mon.close()
    assert sum(issubclass(w.category, MonitorWriteWarning) for w in caught) == 1


@pytest.mark.parametrize("loss, message", [
    ("0.5", "got str '0.5'"),
    (torch.ones(3), r"shape \(3,\)"),
    (np.ones((2, 2)), r"shape \(2, 2\)"),
    ([0.5], "got list"),
    (True, "got bool"),
])
def test_loss_must_be_one_number(tmp_path, loss, message):
    mon = _monitor(tmp_path)
    with pytest.raises(UsageError, match=message) as info:
        mon.step(samples=1, loss=loss)
    assert "loss" in info.value.hint
    mon.close()


def test_scalar_losses_of_every_kind_are_accepted(tmp_path):
    mon = _monitor(tmp_path)
    for loss in (0.5, 1, torch.tensor(0.25), torch.ones(1), np.float32(0.75), np.array([2.0]), None):
        mon.step(samples=1, loss=loss)
    mon.close()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["type"] == "step"]
    assert losses == [0.5, 1.0, 0.25, 1.0, 0.75, 2.0, None]


@pytest.mark.parametrize("samples", [-5, -0.5, float("nan"), True, "8", None])
def test_samples_must_be_a_count(tmp_path, samples):
    mon = _monitor(tmp_path)
    with pytest.raises(UsageError, match="samples must be a count >= 0"):
        mon.step(samples=samples)
    mon.step(samples=3)
    summary = mon.close()
    assert summary["steps"] == 1 and summary["total_samples"] == 3
