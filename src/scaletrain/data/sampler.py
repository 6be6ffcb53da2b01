"""Which samples each rank reads: torch's DistributedSampler made resumable, an evaluation
shard that neither drops nor duplicates, and rank/worker sharding for iterable datasets.

Training shards follow ``torch.utils.data.DistributedSampler`` exactly (same permutation for a
seed and epoch, same padding or truncation, rank ``r`` takes positions ``r, r+W, r+2W, ...``),
so a job that used the seeds' recipe sees the same order through ``scaletrain.loader``. What is
added is ``start``: the number of this rank's samples of the current epoch already consumed,
which a resumed job skips so it continues at exactly the next sample.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info
from torch.utils.data.distributed import DistributedSampler


def shard_sizes(n: int, world_size: int, rank: int, *, mode: str) -> int:
    """Samples rank ``rank`` gets from ``n`` in one epoch.

    ``mode``: ``"drop"`` (truncate to a multiple of the world size: ``n // W`` each),
    ``"pad"`` (repeat the first samples up to a multiple: ``ceil(n / W)`` each), ``"eval"``
    (no drop, no padding: ranks below ``n % W`` get one more).
    """
    if mode == "drop":
        return n // world_size
    if mode == "pad":
        return -(-n // world_size)
    return len(range(rank, n, world_size))


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` whose epoch can start part-way.

    ``start``: samples of this rank's epoch already consumed (a resume on the same world size:
    the order is torch's, bit for bit, minus its first ``start``). ``offset``: positions of the
    epoch's global order already consumed by a job of another world size; the rest of the
    order is then sharded afresh over this world (padding or truncation as usual), so each
    sample of the epoch is still seen once. ``even=False`` is the evaluation shard: no padding
    and no truncation, each index exactly once across ranks, ranks may get different counts
    (``n % W`` ranks get one more). ``len()`` is what the next (or current) pass yields.
    """

    def __init__(self, dataset: Dataset, *, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, even: bool = True) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                         seed=seed, drop_last=drop_last and even)
        self.even = even
        self.mode = "eval" if not even else ("drop" if self.drop_last else "pad")
        self.n = len(dataset)  # type: ignore[arg-type]
        self.start = 0
        self.offset = 0
        self.user_epoch_set = False
        self._sync(epoch=0, start=0, offset=0)

    def set_epoch(self, epoch: int) -> None:
        """As torch's; also noted, so the loader follows an epoch the user sets by hand."""
        if epoch != self.epoch:
            self.user_epoch_set = True
        super().set_epoch(epoch)

    def _sync(self, *, epoch: int, start: int, offset: int = 0) -> None:
        # the loader's own bookkeeping: not a user's set_epoch
        self.epoch, self.start, self.offset = epoch, start, min(offset, self.n)
        self.user_epoch_set = False
        self.num_samples = shard_sizes(self.n - self.offset, self.num_replicas, self.rank,
                                       mode=self.mode)
        if self.even and self.offset == 0:
            self.total_size = self.num_samples * self.num_replicas  # what torch's __iter__ checks

    def global_order(self) -> list[int]:
        """The epoch's permutation of all ``n`` indices (torch's for the same seed and epoch)."""
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def epoch_indices(self) -> list[int]:
        """This rank's whole epoch after ``offset`` (``start`` ignored)."""
        if self.even and self.offset == 0:
            return list(super().__iter__())  # torch's own sharding
        order = self.global_order()[self.offset:]
        world, m = self.num_replicas, len(order)
        if self.mode == "drop":
            order = order[: m // world * world]
        elif self.mode == "pad" and m % world:
            pad = world - m % world  # repeat the first remaining samples, as torch pads
            order += (order * -(-pad // m))[:pad]
        return order[self.rank::world]

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_indices()[self.start:])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start)


class ShardedIterable(IterableDataset):
    """An iterable dataset split across ranks, then across each rank's DataLoader workers.

    Rank ``r`` of ``W`` takes items ``r, r+W, r+2W, ...`` of the source stream. Within a rank,
    workers take whole batches in turn (batch ``c`` of the rank's stream goes to worker
    ``c % num_workers``); the DataLoader collects batches from workers round-robin, so the
    rank sees the same batch sequence with 0, 1 or 8 workers — which is what makes resume exact.

    ``mode``: ``"drop"`` ends every rank at the last complete round of ``W`` items (equal
    counts), ``"pad"`` completes the last round with the stream's first items (as
    DistributedSampler pads), ``"eval"`` neither (each item exactly once, uneven counts).
    ``start`` items of this rank's stream are skipped (resume). If the source has
    ``set_epoch``, it is called with ``epoch`` in each worker before iterating.
    """

    def __init__(self, source: Iterable[Any], *, rank: int, world_size: int, batch_size: int,
                 mode: str = "drop") -> None:
        self.source = source
        self.rank = rank
        self.world_size = world_size
        self.batch_size = batch_size
        self.mode = mode
        self.start = 0
        self.epoch = 0

    def _rank_stream(self) -> Iterator[Any]:
        it = iter(self.source)
        first: list[Any] | None = None
        while True:
            rnd = list(itertools.islice(it, self.world_size))
            if first is None:
                first = rnd
            if not rnd:
                return
            if len(rnd) < self.world_size:
                if self.mode == "drop":
                    return
                if self.mode == "pad" and self.rank >= len(rnd):
                    # position n + k of the padded stream is item k, as DistributedSampler pads
                    yield first[(self.rank - len(rnd)) % len(first)]
                    return
            if self.rank >= len(rnd):
                return
            yield rnd[self.rank]

    def __iter__(self) -> Iterator[Any]:
        if hasattr(self.source, "set_epoch"):
            self.source.set_epoch(self.epoch)
        info = get_worker_info()
        workers, wid = (1, 0) if info is None else (info.num_workers, info.id)
        stream = itertools.islice(self._rank_stream(), self.start, None)
        for k, item in enumerate(stream):
            if (k // self.batch_size) % workers == wid:
                yield item

    def epoch_len(self) -> int | None:
        """Items of this rank's whole epoch (``start`` ignored); None for an unsized source."""
        if not isinstance(self.source, Sized):
            return None
        return shard_sizes(len(self.source), self.world_size, self.rank, mode=self.mode)

    def __len__(self) -> int:
        # only meaningful when the source has a length; DataLoader.len() then works as usual
        n = self.epoch_len()
        if n is None:
            raise TypeError(f"{type(self.source).__name__} has no len()")
        return max(0, n - self.start)
