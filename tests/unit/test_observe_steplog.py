"""The Monitor's step columns: step times, waits, tokens and extras come out as they went in."""

from __future__ import annotations

import itertools
import json
import statistics

import pytest

from scaletrain.observe.steplog import MIN_STEP_S, StepColumns
from scaletrain.observe.stepstats import MEDIAN_SAMPLE, StepStats


def test_step_times_follow_the_ends_with_explicit_starts_and_a_floor():
    cols = StepColumns(first=5, start=10.0, t0=9.0)
    cols.ends += [10.5, 11.0, 11.0, 13.0]
    cols.samples += [1, 1, 1, 1]
    cols.starts[8] = 12.5                     # Monitor.start() called before step 8
    assert cols.step_times() == [0.5, 0.5, MIN_STEP_S, 0.5]
    assert cols.step_times(2) == [MIN_STEP_S, 0.5]
    assert cols.step_times(1, 3) == [0.5, MIN_STEP_S]
    assert [cols.step_time(i) for i in range(4)] == cols.step_times()
    assert cols.row(3) == (8, 4.0, 0.5, 1, None, None, 0.0, None, None)
    nxt = cols.following()
    assert (nxt.first, nxt.start, nxt.t0, len(nxt)) == (9, 13.0, 9.0, 0)


def test_in_range_takes_the_by_step_values_from_an_index_on():
    cols = StepColumns.build([1.0] * 4, [2] * 4, first=10, waits=[0.1, 0.0, 0.3, 0.4])
    assert cols.waits == {10: 0.1, 12: 0.3, 13: 0.4}      # a zero wait is not stored
    assert cols.in_range(cols.waits, 0) == [0.1, 0.3, 0.4]
    assert cols.in_range(cols.waits, 2) == [0.3, 0.4]


def test_stats_fold_in_slices_equal_one_fold():
    times = [0.01 * (1 + (i % 7)) for i in range(50)]
    waits = [0.001 * (i % 3) for i in range(50)]

    def upto(k: int) -> StepColumns:  # the buffer as it stood after k steps
        return StepColumns.build(times[:k], [4] * k, waits=waits[:k], tokens=[100] * k)

    whole, parts = StepStats(warmup=3), StepStats(warmup=3)
    whole.add(upto(50))
    for lo, hi in ((0, 2), (2, 17), (17, 40), (40, 50)):   # the Monitor folds from where it stopped
        parts.add(upto(hi), lo)
    assert parts.samples == whole.samples == 200
    a = whole.run_figures(world_size=2, mfu_scale=None)
    b = parts.run_figures(world_size=2, mfu_scale=None)
    assert a == pytest.approx(b)
    after = times[3:]
    assert a["step_s_mean"] == pytest.approx(sum(after) / len(after))
    assert a["step_s_median"] == pytest.approx(statistics.median(after))
    assert a["tokens_per_s"] == pytest.approx(100 * 47 * 2 / sum(after))
    assert a["data_wait_frac"] == pytest.approx(sum(waits[3:]) / sum(after))


def test_window_median_exact_when_small_and_close_when_sampled():
    small = [0.001 * ((i * 37) % 101 + 1) for i in range(MEDIAN_SAMPLE)]
    stats = StepStats(warmup=0)
    stats.add(StepColumns.build(small, [1] * len(small)))
    assert stats.take_window()[0] == pytest.approx(statistics.median(small))
    big = [0.001 * ((i * 37) % 101 + 1) for i in range(20 * MEDIAN_SAMPLE)]
    stats.add(StepColumns.build(big, [1] * len(big)))
    med, _, _ = stats.take_window()
    assert med == pytest.approx(statistics.median(big), rel=0.03)


def test_monitor_figures_from_a_known_clock(tmp_path, monkeypatch):
    """With a fake clock every figure is known: the step path, the columns and the writer agree."""
    import scaletrain.observe.monitor as monitor_module
    from scaletrain.observe.monitor import Monitor

    ticks = itertools.count()
    monkeypatch.setattr(monitor_module.time, "perf_counter", lambda: next(ticks) * 0.002)
    mon = Monitor(tmp_path, console=False, device_sampler=None, jsonl_every=1, warmup=0)
    # data() reads the clock twice per batch (0.002 s of wait), step() once: steps of 0.006 s
    for i, batch in enumerate(mon.data(range(6))):
        extra = {"lr": 0.5} if i == 2 else {}
        mon.step(samples=8, loss=float(i), tokens=80 if i == 3 else None, **extra)
    summary = mon.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["type"] == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert [s["loss"] for s in steps] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    # the first step began at the first fetch (tick 1), not when the Monitor was made (tick 0)
    assert [s["step_s"] for s in steps] == pytest.approx([0.004] + [0.006] * 5)
    assert [s["data_wait_s"] for s in steps] == pytest.approx([0.002] * 6)
    assert steps[2]["lr"] == 0.5 and "lr" not in steps[1]
    assert steps[3]["tokens"] == 80 and "tokens" not in steps[4]
    assert steps[1]["samples_per_s"] == pytest.approx(8 / 0.006)
    assert summary["steps"] == 6 and summary["total_samples"] == 48
    assert summary["step_s_mean"] == pytest.approx(0.034 / 6)
    assert summary["data_wait_frac"] == pytest.approx(0.012 / 0.034)


def test_given_data_wait_replaces_the_measured_one_and_start_restarts_the_clock(tmp_path, monkeypatch):
    import scaletrain.observe.monitor as monitor_module
    from scaletrain.observe.monitor import Monitor

    ticks = itertools.count()
    monkeypatch.setattr(monitor_module.time, "perf_counter", lambda: next(ticks) * 0.01)
    mon = Monitor(tmp_path, console=False, device_sampler=None, jsonl_every=1, warmup=0)  # tick 0
    it = mon.data(range(3))
    next(it)                                           # ticks 1, 2: a wait of 0.01
    mon.step(samples=1, data_wait_s=0.004)             # tick 3: the given wait wins
    mon.start()                                        # tick 4: step 2 starts here
    mon.step(samples=1, data_wait_s=0)                 # tick 5
    next(it)                                           # ticks 6, 7
    mon.step(samples=1)                                # tick 8
    mon.close()
    steps = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["type"] == "step"]
    assert [s["step_s"] for s in steps] == pytest.approx([0.02, 0.01, 0.03])
    assert [s["data_wait_s"] for s in steps] == pytest.approx([0.004, 0.0, 0.01])


def test_every_rank_checks_its_first_loss_and_only_rank_0_keeps_losses(tmp_path):
    """Ranks without a writer keep at most their first loss (dropped at the first exchange),
    however far apart the exchanges; a bad first loss is one clear error on every rank."""
    from scaletrain.errors import UsageError
    from scaletrain.observe.monitor import Monitor

    class Rank1:
        rank, world_size, device, node_rank, local_rank = 1, 1, "cpu", 0, 1

    mon = Monitor(None, console=False, device_sampler=None, env=Rank1(), every=5)
    with pytest.raises(UsageError, match="loss"):
        mon.step(samples=1, loss="high")
    for _ in range(4):
        mon.step(samples=1, loss=1.0)
    assert list(mon._kept) == [1]                      # the first, checked
    mon.step(samples=1, loss=1.0)
    assert mon._kept == {} and len(mon._cols) == 0     # the first exchange dropped it
    mon.step(samples=1, loss=1.0)
    assert mon._kept == {}                             # and keeps none after it
    mon.close()
