"""Sharding math of scaletrain.loader, with the world simulated by an explicit Env (no processes):
training shards equal torch's DistributedSampler, evaluation shards see each sample once,
epochs reshuffle, iterable datasets are split by rank and by worker."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import scaletrain
from scaletrain.data.sampler import shard_sizes
from scaletrain.runtime.env import Env


def dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


class Stream(IterableDataset):
    """0..n-1 as a stream, with a length; ``set_epoch`` records the epoch it was given."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epoch = -1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


def make(ds, rank: int, world: int, **kw):
    kw.setdefault("num_workers", 0)
    kw.setdefault("batch_size", 2)
    return scaletrain.loader(ds, env=Env(rank=rank, world_size=world), base_world_size=None, **kw)


def flat(batches) -> list[int]:
    return [int(i) for b in batches for i in (b[0] if isinstance(b, list) else b)]


def one_pass(ld) -> list[int]:
    return flat(list(ld))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [10, 11, 12, 13])
@pytest.mark.parametrize("drop_last", [True, False])
def test_training_shards_match_distributed_sampler(world, n, drop_last):
    union: Counter[int] = Counter()
    for rank in range(world):
        ld = make(dataset(n), rank, world, batch_size=1, drop_last=drop_last, seed=7)
        got = one_pass(ld)
        ref = DistributedSampler(dataset(n), num_replicas=world, rank=rank, shuffle=True, seed=7,
                                 drop_last=drop_last)
        assert got == list(ref)
        assert len(got) == shard_sizes(n, world, rank, mode="drop" if drop_last else "pad")
        union.update(got)
    if drop_last:  # disjoint, the tail of n % W samples dropped
        assert sum(union.values()) == n // world * world and max(union.values()) == 1
    else:  # everything, with exactly the padding duplicated
        assert set(union) == set(range(n))
        assert sum(union.values()) - n == -(-n // world) * world - n


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [10, 11, 13])
def test_drop_last_gives_full_batches_and_equal_counts(world, n):
    lens = set()
    for rank in range(world):
        ld = make(dataset(n), rank, world, batch_size=2)
        batches = list(ld)
        assert all(len(b[0]) == 2 for b in batches)
        assert len(batches) == len(ld) == (n // world) // 2
        lens.add(len(batches))
    assert len(lens) == 1  # every rank takes the same number of steps


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 10, 11, 13])
@pytest.mark.parametrize("shuffle", [False, True])
def test_eval_mode_sees_each_sample_exactly_once(world, n, shuffle):
    seen: list[int] = []
    batch_counts = []
    for rank in range(world):
        ld = make(dataset(n), rank, world, batch_size=3, eval=True, shuffle=shuffle)
        got = one_pass(ld)
        assert len(got) == shard_sizes(n, world, rank, mode="eval")
        assert len(ld) == -(-len(got) // 3)
        batch_counts.append(len(ld))
        seen += got
    assert sorted(seen) == list(range(n))
    if n == 13 and world == 4:  # 4,3,3,3 samples: ranks may differ
        assert [shard_sizes(13, 4, r, mode="eval") for r in range(4)] == [4, 3, 3, 3]


def test_eval_rejects_drop_last():
    with pytest.raises(scaletrain.errors.UsageError, match="never drops"):
        make(dataset(10), 0, 2, eval=True, drop_last=True)


def test_epochs_advance_by_themselves_and_reshuffle():
    ld = make(dataset(40), 1, 2, seed=3)
    e0, e1 = one_pass(ld), one_pass(ld)
    assert ld.epoch == 2
    assert e0 != e1  # a forgotten set_epoch would repeat epoch 0's order
    for epoch, got in ((0, e0), (1, e1)):
        ref = DistributedSampler(dataset(40), num_replicas=2, rank=1, seed=3, drop_last=True)
        ref.set_epoch(epoch)
        assert got == list(ref)
    again = make(dataset(40), 1, 2, seed=3)
    assert one_pass(again) == e0 and one_pass(again) == e1  # same seed, same epoch: same order
    other = make(dataset(40), 1, 2, seed=4)
    assert one_pass(other) != e0


def test_epoch_setter_and_users_own_set_epoch():
    ref = make(dataset(40), 0, 2)
    orders = [one_pass(ref) for _ in range(4)]
    ld = make(dataset(40), 0, 2)
    ld.epoch = 3
    assert one_pass(ld) == orders[3] and ld.epoch == 4
    seeds_style = make(dataset(40), 0, 2)
    assert isinstance(seeds_style, torch.utils.data.DataLoader)
    assert isinstance(seeds_style.sampler, DistributedSampler)
    for epoch in (2, 1):  # the seeds' loop: sampler.set_epoch(epoch) before each pass
        seeds_style.sampler.set_epoch(epoch)
        assert seeds_style.epoch == epoch
        assert one_pass(seeds_style) == orders[epoch]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pass_left_partway_is_followed_by_the_next_epoch(workers):
    ref = make(dataset(40), 0, 2)
    orders = [one_pass(ref) for _ in range(3)]
    ld = make(dataset(40), 0, 2, num_workers=workers)  # persistent workers when 2
    it = iter(ld)
    next(it)
    del it
    assert one_pass(ld) == orders[1] and one_pass(ld) == orders[2]
    ld.close()


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("n", [10, 11])
@pytest.mark.parametrize("mode", ["drop", "pad", "eval"])
def test_iterable_sharding(world, n, mode):
    kw = {"eval": True} if mode == "eval" else {"drop_last": mode == "drop"}
    seen: list[int] = []
    for rank in range(world):
        ld = make(Stream(n), rank, world, batch_size=1, **kw)
        got = one_pass(ld)
        assert len(got) == len(ld) == shard_sizes(n, world, rank, mode=mode)
        if mode != "eval":  # the same positions DistributedSampler(shuffle=False) gives
            ref = DistributedSampler(dataset(n), num_replicas=world, rank=rank, shuffle=False,
                                     drop_last=mode == "drop")
            assert got == list(ref)
        else:
            assert got == list(range(rank, n, world))
        seen += got
    if mode == "eval":
        assert sorted(seen) == list(range(n))


def test_iterable_same_batches_with_and_without_workers():
    plain = [b.tolist() for b in make(Stream(23), 1, 2, batch_size=3, drop_last=False)]
    workers = make(Stream(23), 1, 2, batch_size=3, drop_last=False, num_workers=2)
    assert [b.tolist() for b in workers] == plain
    assert plain[0] == [1, 3, 5] and plain[-1] == [19, 21, 0]  # 0: the DistributedSampler-style pad


def test_iterable_source_gets_the_epoch():
    src = Stream(8)
    ld = make(src, 0, 2, batch_size=2)
    one_pass(ld)
    assert src.epoch == 0  # num_workers=0: the loader's own copy
    one_pass(ld)
    assert src.epoch == 1
