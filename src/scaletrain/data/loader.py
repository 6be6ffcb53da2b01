"""``scaletrain.loader``: a DataLoader that shards by rank, advances its epoch by itself and
resumes mid-epoch at exactly the next sample.

What the seeds do by hand (a ``DistributedSampler``, ``shuffle=(sampler is None)``,
``sampler.set_epoch(epoch)`` each epoch, ``num_workers`` matched to ``--cpus-per-task``,
``batch_size`` per GPU) is done here once::

    train = scaletrain.loader(dataset, global_batch_size=256)      # 256 / W per process
    for epoch in range(epochs):
        for x, y in train:                                         # epoch advances each pass
            ...
    state = train.state_dict()        # {"epoch", "consumed", "offset", "seed", "world_size", ...}
    train.load_state_dict(state)      # next pass continues at the next sample

Evaluation shards (``eval=True``) neither drop nor duplicate: each sample is seen exactly once
across ranks, so ranks may get different numbers of samples and of batches (with ``n`` samples
on ``W`` ranks, the first ``n % W`` ranks get one more). Consequence for collectives: do not
call a collective per batch inside the evaluation loop (a rank with fewer batches would stop
calling it and the others would hang); accumulate locally and reduce once after the loop with
``scaletrain.all_reduce_mean(value, weight=n_seen)`` or ``scaletrain.gather_objects``. Forward
passes are collectives under the sharded strategies (zero2/zero3/FSDP all-gather parameters):
evaluate those with ``eval=False, drop_last=False`` (padded to equal shards; the few duplicate
samples are counted twice) or on the unsharded model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from scaletrain.data import shares
from scaletrain.data.lr import check_global_batch
from scaletrain.data.sampler import ResumableDistributedSampler, ShardedIterable
from scaletrain.data.shares import check_option, per_process_batch, resolve_env
from scaletrain.errors import ScaletrainError, UsageError
from scaletrain.runtime import timeouts
from scaletrain.runtime.current import group_rank_world
from scaletrain.runtime.env import Env

class DistributedLoader(DataLoader):
    """A DataLoader over this rank's shard, with automatic epochs and exact resume.

    ``epoch`` is the epoch of the current pass (or of the next one between passes); set it to
    jump to an epoch's start. Each new ``iter()`` is a new pass: the first continues where the
    state says (0 at first, or what ``load_state_dict`` restored); after a finished pass, or one
    left part-way (``break``), the next pass is the next epoch. A user's own
    ``loader.sampler.set_epoch(e)`` between passes is followed (so the seeds' loops still work).

    The resume point counts batches handed to the caller in the main process — not batches
    prefetched by workers — so it is exact with ``num_workers > 0``.
    """

    def __init__(self, dataset: Dataset, *, env: Env, per_process_batch: int, mode: str,
                 shuffle: bool, seed: int, drop_last: bool, **kwargs: Any) -> None:
        self.env = env
        self.mode = mode  # "drop" | "pad" | "eval"
        self.seed = seed
        self._epoch = 0
        self._consumed = 0          # samples of this rank's current epoch already handed out
        self._offset = 0            # global positions of this epoch consumed by another world size
        self._in_pass = False       # a pass was started and has not finished
        self._batches_done = 0      # batches handed out in the current pass
        self._iterable = isinstance(dataset, IterableDataset)
        sampler: ResumableDistributedSampler | None = None
        if isinstance(dataset, IterableDataset):  # as self._iterable, narrowed for mypy
            dataset = ShardedIterable(dataset, rank=env.rank, world_size=env.world_size,
                                      batch_size=per_process_batch, mode=mode)
        else:
            sampler = ResumableDistributedSampler(
                dataset, num_replicas=env.world_size, rank=env.rank, shuffle=shuffle, seed=seed,
                drop_last=(mode == "drop"), even=(mode != "eval"))
        # Worker processes seed their RNGs from the DataLoader's generator. Left to torch's
        # global RNG, ranks that seeded torch alike (for identical model init) would draw
        # identical random augmentations; a generator per rank and epoch makes them differ
        # across ranks and repeat for the same seed and epoch.
        self._own_generator = kwargs.get("generator") is None
        if self._own_generator:
            kwargs["generator"] = torch.Generator()
        super().__init__(dataset, batch_size=per_process_batch, sampler=sampler,
                         drop_last=drop_last, **kwargs)
        self._goto(0)

    # -- state ---------------------------------------------------------------------------
    def _goto(self, epoch: int, consumed: int = 0, offset: int = 0) -> None:
        """Make the next pass start at ``consumed`` samples (``offset`` global positions) into
        ``epoch``, and tell the sampler (map-style) or the sharded iterable."""
        self._epoch, self._consumed, self._offset = epoch, consumed, offset
        self._in_pass, self._batches_done = False, 0
        if isinstance(self.sampler, ResumableDistributedSampler):
            self.sampler._sync(epoch=epoch, start=consumed, offset=offset)
        elif isinstance(self.dataset, ShardedIterable):
            self.dataset.epoch = epoch
            self.dataset.start = consumed

    def _pass_samples(self) -> int | None:
        """Samples this rank's whole current epoch holds, or None for an unsized iterable."""
        if isinstance(self.sampler, ResumableDistributedSampler):
            return self.sampler.num_samples
        if isinstance(self.dataset, ShardedIterable):
            return self.dataset.epoch_len()
        return None

    @property
    def epoch(self) -> int:
        """The epoch of the current pass, or of the next pass between passes."""
        sampler = self.sampler
        if isinstance(sampler, ResumableDistributedSampler) and sampler.user_epoch_set:
            return sampler.epoch  # the user's set_epoch, applied when the next pass starts
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._goto(check_option("epoch", value, "DistributedLoader"))

    def set_epoch(self, epoch: int) -> None:
        """Same as ``loader.epoch = epoch``: the next pass starts epoch ``epoch`` from its start."""
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """Where the next sample comes from: ``epoch``, ``consumed`` (samples of that epoch this
        rank already handed out), ``offset`` (positions consumed before a world-size change),
        ``seed``, ``world_size``, ``rank``, ``mode``. In training mode every rank's state has
        the same numbers, so rank 0's is enough; evaluation shards differ per rank."""
        epoch, consumed, offset = self._epoch, self._consumed, self._offset
        total = self._pass_samples()
        # a pass whose last batch was handed out is over: say "next epoch, from its start"
        if total is not None and consumed > 0 and (
                consumed >= total or (self._in_pass and self._batches_done >= len(self))):
            epoch, consumed, offset = epoch + 1, 0, 0
        return {"epoch": epoch, "consumed": consumed, "offset": offset, "seed": self.seed,
                "world_size": self.env.world_size, "rank": self.env.rank, "mode": self.mode}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state``: the next pass starts where the saved loader would have.

        Same world size: exactly the next sample, in the same order. Another world size, in
        training mode on a map-style dataset: the rest of the epoch's global order is sharded
        over the new world, so no sample of the epoch is repeated or skipped (apart from the
        usual padding or truncation), though batches differ from an uninterrupted run. Other
        cases of a changed world mid-epoch, and another seed, raise ``UsageError``.
        """
        try:
            epoch, consumed = int(state["epoch"]), int(state["consumed"])
            offset = int(state.get("offset", 0))
            seed, world = int(state["seed"]), int(state["world_size"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"not a scaletrain loader state: {exc!s}",
                             hint="pass what loader.state_dict() returned") from None
        if seed != self.seed:
            raise UsageError(f"loader state has seed={seed}, this loader seed={self.seed}",
                             hint=f"build the loader with seed={seed} to resume its order")
        if world != self.env.world_size and (consumed or offset):
            if self.mode == "eval" or state.get("mode") == "eval" \
                    or not isinstance(self.sampler, ResumableDistributedSampler):
                raise UsageError(
                    f"loader state is {consumed} samples into epoch {epoch} on {world} "
                    f"processes; this job has {self.env.world_size}",
                    hint="resume an evaluation or iterable-dataset loader with the same number "
                         "of processes, or from a state taken at an epoch boundary")
            # rank r consumed positions r, r+W, ..., so together the first consumed*W of the
            # epoch's (padded or truncated) global order: continue after them
            offset, consumed = offset + consumed * world, 0
        self._goto(epoch, consumed, offset)
        if offset and self._pass_samples() == 0:  # nothing left of that epoch on any rank
            self._goto(epoch + 1)

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        sampler = self.sampler
        if isinstance(sampler, ResumableDistributedSampler) and sampler.user_epoch_set:
            self._goto(sampler.epoch)  # the user's own set_epoch, as in the seeds' loops
        elif self._in_pass:  # the previous pass was left part-way: this one is the next epoch
            self._goto(self._epoch + 1)
        self._in_pass = True
        if self._own_generator and self.generator is not None:
            mixed = ((self.seed * 1_000_003 + self.env.rank) * 1_000_033 + self._epoch)
            self.generator.manual_seed(mixed % (2**63))
        return self._run_pass(super().__iter__())

    def _run_pass(self, batches: Iterator[Any]) -> Iterator[Any]:
        total = self._pass_samples()
        assert self.batch_size is not None  # always set by __init__
        for batch in batches:
            if self._batches_done == 1 and self.mode != "eval":
                # a second batch is asked for: a training step ran, so every rank is in the
                # loop and collectives may use the shorter step timeout
                timeouts.training_started()
            self._batches_done += 1
            self._consumed += self.batch_size
            if total is not None:
                self._consumed = min(self._consumed, total)
            yield batch
        self._goto(self._epoch + 1)

    def close(self) -> None:
        """Stop persistent workers now (they otherwise live as long as the loader)."""
        it = getattr(self, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._iterator = None


def loader(dataset: Dataset, batch_size: int | None = None, global_batch_size: int | None = None,
           shuffle: bool | None = None, drop_last: bool | None = None,
           num_workers: int | str = "auto", seed: int = 0, eval: bool = False,
           collate_fn: Callable[[list[Any]], Any] | None = None, pin_memory: bool | None = None,
           persistent_workers: bool | None = None, env: Env | None = None, *,
           rank: int | None = None, world_size: int | None = None, group: Any = None,
           base_world_size: int | None = 1, **dataloader_kwargs: Any) -> DistributedLoader:
    """A DataLoader over this process's shard of ``dataset``.

    Args:
        dataset: map-style (sharded by a resumable ``DistributedSampler``) or iterable (rank
            ``r`` takes every ``W``-th item; workers split the rank's batches). An iterable
            dataset is not shuffled here: if it has ``set_epoch(epoch)``, that is called in
            every worker before each pass so it can reshuffle itself.
        batch_size: samples per process per step. Exactly one of this and ``global_batch_size``.
        global_batch_size: samples per optimizer step over all processes, divided by the world
            size (``UsageError`` naming the nearest valid sizes if it does not divide).
        shuffle: reshuffle every epoch (seeded by ``seed + epoch``); default True, False in eval.
        drop_last: training default True: every rank gets ``n // W`` samples and only full
            batches. False: shards padded with repeated samples to equal size
            (DistributedSampler's behaviour), last batch may be short. Not allowed with eval.
        num_workers: ``"auto"`` (see ``auto_num_workers``) or a number.
        seed: the shuffle seed; the same on every rank.
        eval: evaluation shard: no shuffle, no drop, no padding; each sample exactly once
            across ranks, ranks may get different numbers of batches (see the module doc).
        pin_memory: default: True when the process's device is CUDA.
        persistent_workers: default True when ``num_workers > 0`` (map-style datasets);
            iterable datasets re-create workers each pass so epoch and resume reach them.
        env: the Env to shard for; default ``scaletrain.init()``'s, then the live process
            group, then ``scaletrain.detect()``. ``rank``/``world_size`` override it.
        group: shard over this process group instead (e.g. the data-parallel group of a
            pipeline or hybrid layout: ranks of one pipeline replica then read the same data,
            and ``global_batch_size`` is divided by the data-parallel size only).
        base_world_size: the number of processes the learning rate was tuned for (default 1).
            With ``batch_size=`` on another world size, a ``GlobalBatchWarning`` says the global
            batch changed and how to scale the learning rate. None: no check.
        **dataloader_kwargs: passed to ``torch.utils.data.DataLoader`` (prefetch_factor,
            worker_init_fn, multiprocessing_context, ...); ``sampler``/``batch_sampler`` are ours.

    Returns:
        A ``DistributedLoader`` (a DataLoader): iterate it, ``len()`` is this rank's batches in
        the current pass, ``.epoch``, ``.state_dict()``/``.load_state_dict()``, ``.close()``.
    """
    _check_dataset(dataset)
    for key in ("sampler", "batch_sampler"):
        if key in dataloader_kwargs:
            raise UsageError(f"scaletrain.loader chooses the {key} itself",
                             hint="drop the sampler argument; shuffle=, seed= and eval= control "
                                  "the order, or use torch's DataLoader directly")
    check_option("seed", seed)
    asked_workers = check_option("num_workers", num_workers)   # "auto" or an int from 0
    for name, value in (("rank", rank), ("world_size", world_size), ("base_world_size", base_world_size),
                        ("eval", eval), ("collate_fn", collate_fn), ("env", env), ("shuffle", shuffle),
                        ("drop_last", drop_last), ("pin_memory", pin_memory),
                        ("persistent_workers", persistent_workers), ("group", group)):
        check_option(name, value)
    if group is not None:
        rank, world_size = group_rank_world(group)
        if rank < 0:
            raise UsageError("this process is not a member of the group passed to loader()",
                             hint="pass the data-parallel group this rank belongs to")
    env = resolve_env(env, rank=rank, world_size=world_size)
    per = per_process_batch(batch_size, global_batch_size, env.world_size)
    if eval:
        if drop_last:
            raise UsageError("eval=True never drops samples, drop_last=True contradicts it",
                             hint="leave drop_last unset with eval=True")
        mode, shuffle, drop_last = "eval", bool(shuffle), False
    else:
        shuffle = True if shuffle is None else shuffle
        drop_last = True if drop_last is None else drop_last
        mode = "drop" if drop_last else "pad"
        if batch_size is not None:
            check_global_batch(per, env.world_size, base_world_size=base_world_size,
                               is_main=env.is_main)
    workers: int = shares.auto_num_workers(env) if asked_workers == "auto" else asked_workers
    iterable = isinstance(dataset, IterableDataset)
    if persistent_workers is None:
        persistent_workers = workers > 0 and not iterable
    elif persistent_workers and iterable:
        raise UsageError("persistent_workers=True with an IterableDataset would keep the first "
                         "epoch's shard position in the workers",
                         hint="leave persistent_workers unset for iterable datasets")
    if persistent_workers and workers == 0:
        persistent_workers = False
    if pin_memory is None:
        pin_memory = env.device.startswith("cuda") and torch.cuda.is_available()
    result = DistributedLoader(dataset, env=env, per_process_batch=per, mode=mode,
                               shuffle=shuffle, seed=seed, drop_last=drop_last,
                               num_workers=workers, collate_fn=collate_fn,
                               pin_memory=pin_memory, persistent_workers=persistent_workers,
                               **dataloader_kwargs)
    _check_not_empty(result, dataset, per, env.world_size, global_batch_size is not None)
    return result


def _check_dataset(dataset: Any) -> None:
    """``UsageError`` unless ``dataset`` is one a DataLoader can shard: an ``IterableDataset``, or
    map-style (``__len__`` and ``__getitem__``). A generator or None failed deep inside torch's
    sampler with "object of type 'generator' has no len()"."""
    if isinstance(dataset, IterableDataset):
        return
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        try:   # the sampler's first question: a __len__ of -1 or 10**400 failed deep inside it
            len(dataset)
        except (TypeError, ValueError, OverflowError) as exc:
            raise UsageError(f"scaletrain.loader: the dataset's len() must be a whole number from 0 "
                             f"({type(exc).__name__}: {exc})",
                             hint="return the number of samples from the dataset's __len__") from None
        return
    what = "None" if dataset is None else f"a {type(dataset).__name__}"
    hint = ("wrap a stream in a torch IterableDataset (class Stream(IterableDataset): "
            "def __iter__(self): ...) or pass a list or a map-style Dataset")
    if dataset is None:
        hint = "pass the dataset to read: scaletrain.loader(dataset, batch_size=...)"
    raise UsageError(f"scaletrain.loader needs a dataset: map-style (with __len__ and __getitem__) "
                     f"or a torch IterableDataset, got {what}", hint=hint)


def _check_not_empty(result: DistributedLoader, dataset: Dataset, per: int, world: int,
                     is_global: bool) -> None:
    """A training loader of a sized dataset that would yield no step is a mistake, not an
    empty epoch: a loop over it would end at once and "finish" without training."""
    if result.mode == "eval":
        return  # ranks may legitimately get nothing to evaluate (fewer samples than ranks)
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return  # an unsized iterable: its length is only known by reading it
    if size == 0:
        raise UsageError("the dataset is empty: the loader would yield 0 steps",
                         hint="check the dataset's path and filters")
    samples = result._pass_samples()
    if samples is None or samples >= per or (samples > 0 and not result.drop_last):
        return
    batch = f"a global batch of {per * world}" if is_global else f"batch_size={per} per process"
    raise UsageError(
        f"{batch} is larger than the {size} samples of the dataset on {world} process(es) "
        f"({samples} per process): the loader would yield 0 steps",
        hint=f"use global_batch_size={max(1, size // world) * world} or less, or "
             "drop_last=False to train on a short last batch")
