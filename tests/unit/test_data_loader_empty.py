"""A loader that would yield no step is an error, not a silent empty epoch; the loader tells
the timeouts module when training has started (a second batch was asked for)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

import scaletrain
from scaletrain.errors import UsageError
from scaletrain.runtime import timeouts
from scaletrain.runtime.env import Env


def make(n: int, world: int = 1, **kw):
    kw.setdefault("num_workers", 0)
    env = Env(rank=0, world_size=world, device="cpu")
    return scaletrain.loader(TensorDataset(torch.arange(n)), env=env, base_world_size=None, **kw)


def test_global_batch_larger_than_the_dataset_is_refused():
    with pytest.raises(UsageError) as info:
        make(10, world=2, global_batch_size=16)
    err = info.value
    assert "global batch of 16" in err.message and "10 samples" in err.message
    assert "global_batch_size=10" in err.hint or "drop_last=False" in err.hint


def test_per_process_batch_larger_than_the_shard_is_refused():
    with pytest.raises(UsageError, match="0 steps"):
        make(7, world=2, batch_size=4)  # 3 samples per rank, batch 4, drop_last


def test_empty_dataset_is_refused_even_without_drop_last():
    with pytest.raises(UsageError, match="empty"):
        make(0, batch_size=2, drop_last=False)


@pytest.mark.parametrize("n,kw,steps", [(8, {"batch_size": 8}, 1),
                                       (5, {"batch_size": 8, "drop_last": False}, 1),
                                       (3, {"batch_size": 2, "eval": True}, 2)])
def test_small_but_valid_loaders_still_work(n, kw, steps):
    assert len(make(n, **kw)) == steps


def test_eval_loader_with_fewer_samples_than_ranks_is_allowed():
    # 1 sample on 2 ranks: rank 1 legitimately gets nothing in evaluation mode
    env = Env(rank=1, world_size=2, device="cpu")
    ld = scaletrain.loader(TensorDataset(torch.arange(1)), env=env, batch_size=1, eval=True,
                           num_workers=0, base_world_size=None)
    assert len(ld) == 0


def test_second_batch_marks_training_started(monkeypatch):
    calls = []
    monkeypatch.setattr(timeouts, "training_started", lambda: calls.append(1) or True)
    it = iter(make(8, batch_size=2))
    next(it)
    assert calls == []          # one batch: a step may not have run yet
    next(it)
    next(it)
    assert calls == [1]         # asked once per pass, at the second batch
