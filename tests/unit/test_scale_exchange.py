"""The Monitor's exchange at thousands of ranks: what a rank receives does not grow with the job,
and rank 0's straggler search is one sort, not one per rank (docs/scale.md)."""

from __future__ import annotations

import json
import random
import statistics
from types import SimpleNamespace

import pytest

from scaletrain.observe.health import RankWindow, stragglers


class Counted(float):
    """A float that counts the comparisons made with it (the work of a sort or a median)."""

    calls = 0

    def __lt__(self, other: object) -> bool:
        Counted.calls += 1
        return float.__lt__(self, other)  # type: ignore[arg-type]

    def __gt__(self, other: object) -> bool:
        Counted.calls += 1
        return float.__gt__(self, other)  # type: ignore[arg-type]


def test_medians_of_others_are_the_medians_of_the_other_values():
    from scaletrain.observe.health import medians_of_others

    rng = random.Random(5)
    for n in list(range(1, 30)) + [101, 102]:
        values = [rng.choice([0.1, 0.2, 0.2, rng.random()]) for _ in range(n)]   # ties included
        want = [statistics.median(values[:i] + values[i + 1:]) if n > 1 else None for i in range(n)]
        assert medians_of_others(values) == want


def test_the_straggler_search_compares_n_log_n_times_not_n_squared():
    """24,000 windows: a median of the others per rank was 24,000 sorts on rank 0 every exchange."""
    n = 600

    class Window(RankWindow):
        @property
        def busy_s(self) -> float:      # compared as it is read: every comparison counted
            return Counted(self.step_s)

    windows = [Window(rank=r, host="h", device="cpu", step_s=0.1 + (r % 37) * 1e-4 + (0.5 if r == 7 else 0))
               for r in range(n)]
    Counted.calls = 0
    found = stragglers(windows)
    assert [w.rank for w, _ in found] == [7]
    # one sort (~n log2 n) and a binary search per rank; a median of n-1 others per rank is ~n^2 log n
    assert Counted.calls < 8 * n * 10, Counted.calls


class _Dist:
    """torch.distributed as rank ``rank`` of ``world`` sees it: the other ranks send the same
    window; counts what this rank receives."""

    class ReduceOp:
        MAX, SUM = "max", "sum"

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world, self.received, self.calls = rank, world, 0, []

    def all_reduce(self, tensor, op=None, group=None):
        self.calls.append("all_reduce")
        self.received += tensor.numel() * tensor.element_size()

    def gather(self, tensor, gather_list=None, dst=0, group=None):
        import torch

        self.calls.append("gather")
        if gather_list is not None:
            for part in gather_list:
                part.copy_(tensor)
                self.received += part.numel()

    def all_gather_object(self, out, obj, group=None):   # what the Monitor must not call any more
        self.calls.append("all_gather_object")
        data = json.dumps(obj).encode()
        self.received += len(data) * self.world
        out[:] = [json.loads(data)] * self.world


def _exchange(rank: int, world: int, monkeypatch) -> _Dist:
    import scaletrain.observe.monitor as monitor_mod

    fake = _Dist(rank, world)
    monkeypatch.setattr(monitor_mod, "live_dist", lambda: fake)
    env = SimpleNamespace(rank=rank, world_size=world, device="cpu", node_rank=rank // 4, local_rank=rank % 4)
    mon = monitor_mod.Monitor(None, env=env, every=5, console=False)
    for _ in range(5):
        mon.step(samples=4)      # the 5th step exchanges
    mon._closed = True           # no close(): its collectives are not what is counted here
    return fake


@pytest.mark.parametrize("world", [8, 4096])
def test_a_rank_other_than_0_receives_the_same_few_bytes_at_any_world_size(world, monkeypatch):
    fake = _exchange(1, world, monkeypatch)
    assert "all_gather_object" not in fake.calls and fake.calls == ["all_reduce", "gather"]
    assert fake.received == 16       # the slowest step time and the longest record: two float64


def test_rank_0_receives_every_window_and_derives_the_same_next_exchange(monkeypatch):
    fake = _exchange(0, 64, monkeypatch)
    assert fake.calls == ["all_reduce", "gather"]
    assert 64 * 100 < fake.received < 64 * 2000   # one record a rank, a few hundred bytes each
