"""scaletrain.loader without processes: batch-size arithmetic and its errors, exact mid-epoch
resume (0 and 2 workers, across an epoch boundary), worker/pinning defaults, the global-batch
warning."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import scaletrain
from scaletrain.data import shares
from scaletrain.data import lr as lr_mod
from scaletrain.data.shares import auto_num_workers, per_process_batch
from scaletrain.errors import UsageError
from scaletrain.runtime.env import Env


def dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


class Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def make(ds, rank=0, world=1, env_device="cpu", **kw):
    kw.setdefault("num_workers", 0)
    kw.setdefault("batch_size", 4)
    env = Env(rank=rank, world_size=world, device=env_device)
    return scaletrain.loader(ds, env=env, base_world_size=None, **kw)


def ids(batch) -> list[int]:
    return (batch[0] if isinstance(batch, list) else batch).tolist()


# -- batch sizes -------------------------------------------------------------------------
def test_global_batch_is_divided_by_world_size():
    assert per_process_batch(None, 256, 4) == 64
    assert per_process_batch(64, None, 4) == 64
    assert make(dataset(256), 0, 4, batch_size=None, global_batch_size=256).batch_size == 64
    assert make(dataset(256), 2, 3, batch_size=5).batch_size == 5


def test_indivisible_global_batch_names_nearest_sizes():
    with pytest.raises(UsageError) as err:
        per_process_batch(None, 100, 3)
    assert "not divisible by 3" in err.value.message
    assert "99 (33 per process)" in err.value.hint and "102 (34 per process)" in err.value.hint
    with pytest.raises(UsageError) as err:
        per_process_batch(None, 2, 4)
    assert "4 (1 per process)" in err.value.hint and "0 (" not in err.value.hint


@pytest.mark.parametrize("args", [(None, None), (8, 16), (0, None), (None, -4), (True, None),
                                  (2.5, None)])
def test_exactly_one_positive_batch_size(args):
    with pytest.raises(UsageError):
        per_process_batch(*args, 2)


# -- resume ------------------------------------------------------------------------------
def reference(ds, epochs: int, **kw) -> list[list[list[int]]]:
    ld = make(ds, **kw)
    out = [[ids(b) for b in ld] for _ in range(epochs)]
    ld.close()
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [1, 3])
def test_resume_mid_epoch_continues_with_exactly_the_rest(workers, k):
    kw = {"rank": 1, "world": 2, "batch_size": 3, "num_workers": workers, "seed": 5}
    ref = reference(dataset(37), 2, **kw)  # rank 1 of 2: 18 samples, 6 batches per epoch
    ld = make(dataset(37), **kw)
    it = iter(ld)
    first = [ids(next(it)) for _ in range(k)]
    state = json.loads(json.dumps(ld.state_dict()))  # survives a JSON checkpoint
    del it
    ld.close()
    assert first == ref[0][:k]
    assert state["epoch"] == 0 and state["consumed"] == 3 * k

    resumed = make(dataset(37), **kw)
    resumed.load_state_dict(state)
    assert len(resumed) == len(ref[0]) - k
    rest = [ids(b) for b in resumed]
    assert rest == ref[0][k:]  # an off-by-one would repeat or skip a batch
    assert [ids(b) for b in resumed] == ref[1]  # and the next epoch is the reference's epoch 1
    resumed.close()


def test_resume_across_the_epoch_boundary():
    ref = reference(dataset(20), 3, batch_size=4, seed=1)
    ld = make(dataset(20), batch_size=4, seed=1)
    it = iter(ld)
    for _ in range(5):  # every batch of epoch 0, the generator not yet exhausted
        next(it)
    state = ld.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, 0)
    resumed = make(dataset(20), batch_size=4, seed=1)
    resumed.load_state_dict(state)
    assert [ids(b) for b in resumed] == ref[1]
    assert [ids(b) for b in resumed] == ref[2]
    ld2 = make(dataset(20), batch_size=4, seed=1)
    for _ in ld2:  # a finished pass
        pass
    assert ld2.state_dict()["epoch"] == 1 and ld2.epoch == 1


def test_resume_with_drop_last_remainder_is_next_epoch():
    # 10 samples, batch 4, drop_last: 2 batches, 2 samples dropped; after both, epoch 0 is done
    ld = make(dataset(10), batch_size=4)
    it = iter(ld)
    next(it), next(it)
    assert (ld.state_dict()["epoch"], ld.state_dict()["consumed"]) == (1, 0)


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_resume_mid_epoch(workers):
    kw = {"rank": 0, "world": 2, "batch_size": 2, "num_workers": workers, "drop_last": False}
    ref = reference(Stream(21), 1, **kw)[0]
    ld = make(Stream(21), **kw)
    it = iter(ld)
    first = [ids(next(it)) for _ in range(2)]
    state = ld.state_dict()
    del it
    resumed = make(Stream(21), **kw)
    resumed.load_state_dict(state)
    assert first + [ids(b) for b in resumed] == ref


def test_bad_states_are_refused():
    ld = make(dataset(20), 0, 2, batch_size=2)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    del it
    with pytest.raises(UsageError, match="seed"):
        make(dataset(20), 0, 2, batch_size=2, seed=9).load_state_dict(state)
    with pytest.raises(UsageError, match="not a scaletrain loader state"):
        ld.load_state_dict({"epoch": 1})
    ev = make(dataset(20), 0, 2, batch_size=2, eval=True)
    it = iter(ev)
    next(it)
    ev_state = ev.state_dict()
    del it
    with pytest.raises(UsageError, match="on 2 processes; this job has 4"):
        make(dataset(20), 0, 4, batch_size=2, eval=True).load_state_dict(ev_state)
    with pytest.raises(UsageError, match="iterable"):
        make(Stream(20), 0, 4, batch_size=2).load_state_dict(dict(state, mode="drop"))
    at_boundary = dict(ev_state, consumed=0, epoch=1)
    make(dataset(20), 0, 4, batch_size=2, eval=True).load_state_dict(at_boundary)  # fine


@pytest.mark.parametrize("old,new,drop_last", [(3, 2, True), (2, 4, False), (4, 1, False),
                                               (2, 3, True), (3, 2, False)])
def test_resume_on_another_world_size_sees_the_rest_of_the_epoch_once(old, new, drop_last):
    n, k, bs = 23, 2, 2
    kw = {"batch_size": bs, "drop_last": drop_last, "seed": 3}
    seen_before, states = [], []
    for rank in range(old):
        ld = make(dataset(n), rank, old, **kw)
        it = iter(ld)
        seen_before += [i for _ in range(k) for i in ids(next(it))]
        states.append(ld.state_dict())
        del it
    assert len({(s["epoch"], s["consumed"]) for s in states}) == 1  # same on every rank
    seen_after, next_epoch = [], []
    for rank in range(new):
        ld = make(dataset(n), rank, new, **kw)
        ld.load_state_dict(states[0])
        seen_after += [i for b in ld for i in ids(b)]
        next_epoch.append([i for b in ld for i in ids(b)])
    both = seen_before + seen_after
    rest = n - k * bs * old
    if drop_last:  # nothing twice; only the new world's truncation is left out
        assert len(set(both)) == len(both) == k * bs * old + new * (rest // new // bs * bs)
    else:  # everything, duplicates only for the new world's padding
        assert set(both) == set(range(n)) and len(both) == k * bs * old + -(-rest // new) * new
        # the padding repeats the first samples of the rest of the epoch, as torch pads
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(3)).tolist()
        pad = -(-rest // new) * new - rest
        dups = [i for i in set(both) if both.count(i) > 1]
        assert sorted(dups) == sorted(perm[n - rest: n - rest + pad])
    for rank in range(new):  # and the following epoch is the new world's ordinary epoch 1
        ref = DistributedSampler(dataset(n), num_replicas=new, rank=rank, seed=3,
                                 drop_last=drop_last)
        ref.set_epoch(1)
        want = list(ref)
        assert next_epoch[rank] == (want[: len(want) // bs * bs] if drop_last else want)


# -- defaults ----------------------------------------------------------------------------
@pytest.mark.parametrize("cpus,total,local,want", [
    (1, 1, 1, 0), (2, 2, 1, 1), (4, 64, 1, 3), (64, 64, 1, 8), (64, 64, 8, 7), (8, 8, 8, 0),
    (16, 16, 2, 7)])
def test_auto_num_workers(monkeypatch, cpus, total, local, want):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    monkeypatch.setattr(os, "cpu_count", lambda: total)
    assert auto_num_workers(Env(local_world_size=local, world_size=local)) == want


def test_worker_and_pinning_defaults(monkeypatch):
    monkeypatch.setattr(shares, "auto_num_workers", lambda env: 2)
    ld = scaletrain.loader(dataset(8), batch_size=2, env=Env())
    assert ld.num_workers == 2 and ld.persistent_workers and not ld.pin_memory
    assert not scaletrain.loader(Stream(8), batch_size=2, env=Env()).persistent_workers
    assert not make(dataset(8), num_workers=0).persistent_workers
    with pytest.raises(UsageError, match="IterableDataset"):
        make(Stream(8), num_workers=1, persistent_workers=True)
    with pytest.raises(UsageError, match="num_workers"):
        make(dataset(8), num_workers=-1)
    with pytest.raises(UsageError, match="sampler"):
        make(dataset(8), sampler=None)
    with pytest.raises(UsageError, match="rank 2"):
        make(dataset(8), rank=2, world=2)
    with pytest.raises(UsageError, match="seed"):
        make(dataset(8), seed=-1)


def test_pin_memory_follows_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # constructing pins nothing
    assert make(dataset(8), num_workers=0, env_device="cuda:0").pin_memory
    assert not make(dataset(8), num_workers=0).pin_memory
    assert not make(dataset(8), num_workers=0, env_device="cuda:0", pin_memory=False).pin_memory


def test_env_from_init_then_detect(clean_env, monkeypatch):
    from scaletrain.runtime import session as rt  # where init() leaves its Env

    monkeypatch.setattr(rt, "_ENV", Env(rank=1, world_size=3))
    ld = scaletrain.loader(dataset(9), batch_size=1, shuffle=False, num_workers=0,
                           base_world_size=None)
    assert (ld.env.rank, ld.env.world_size) == (1, 3)
    assert [ids(b)[0] for b in ld] == [1, 4, 7]
    monkeypatch.setattr(rt, "_ENV", None)  # not initialised: the launcher's variables
    for key, value in {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        clean_env.setenv(key, value)
    ld = scaletrain.loader(dataset(9), batch_size=1, shuffle=False, num_workers=0,
                           base_world_size=None)
    assert (ld.env.rank, ld.env.world_size, ld.env.launcher) == (2, 4, "torchrun")
    clean_env.setenv("RANK", "7")  # what detect() refuses reaches the caller
    with pytest.raises(scaletrain.errors.DistEnvError):
        scaletrain.loader(dataset(9), batch_size=1, num_workers=0)


def test_env_comes_from_explicit_rank_and_world_size():
    ld = scaletrain.loader(dataset(12), batch_size=1, rank=2, world_size=3, num_workers=0,
                           base_world_size=None, shuffle=False)
    assert [ids(b)[0] for b in ld] == [2, 5, 8, 11]


class Noise(torch.utils.data.Dataset):
    """Draws from the RNG in __getitem__, as a random augmentation does."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> float:
        return float(torch.rand(()))


def test_worker_random_streams_differ_by_rank_and_repeat_by_epoch():
    def draws(rank: int, epochs: int = 1) -> list[list[float]]:
        torch.manual_seed(0)  # every rank seeds torch alike, as for identical model init
        ld = make(Noise(), rank, 2, batch_size=2, num_workers=1, persistent_workers=False,
                  shuffle=False)
        return [[v for b in ld for v in b.tolist()] for _ in range(epochs)]

    r0 = draws(0, epochs=2)
    assert r0[0] != draws(1)[0]  # ranks do not share augmentation randomness
    assert r0[0] != r0[1]  # nor do epochs
    assert draws(0) == r0[:1]  # same seed, rank and epoch: same draws


# -- global batch warning ----------------------------------------------------------------
def test_global_batch_warning_once(monkeypatch):
    monkeypatch.setattr(lr_mod, "_warned", set())
    env = Env(rank=0, world_size=4)
    with pytest.warns(lr_mod.GlobalBatchWarning, match=r"global batch is 256 = 64 x 4 processes; "
                                                        r"it was 64 = 64 x 1") as rec:
        scaletrain.loader(dataset(256), batch_size=64, env=env, num_workers=0)
    assert "scale_lr(lr, 64, 256)" in str(rec[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaletrain.loader(dataset(256), batch_size=64, env=env, num_workers=0)  # only once
        scaletrain.loader(dataset(256), global_batch_size=64, env=env, num_workers=0)
        scaletrain.loader(dataset(256), batch_size=32, env=env, num_workers=0, base_world_size=4)
        scaletrain.loader(dataset(256), batch_size=32, env=Env(rank=1, world_size=2), num_workers=0)
        scaletrain.loader(dataset(256), batch_size=32, env=Env(), num_workers=0)
