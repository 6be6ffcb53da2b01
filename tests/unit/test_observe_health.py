"""Straggler and idle-device findings from cross-rank windows (pure)."""

from __future__ import annotations

from scaletrain.observe.devices import lookup
from scaletrain.observe.health import HealthTracker, RankWindow, attach_samples, idle_cause, stragglers


def _w(rank, step, comm=None, wait=0.0, util=None, host=None):
    return RankWindow(rank=rank, host=host or f"node{rank // 4}", device=f"cuda:{rank % 4}",
                      step_s=step, comm_wait_s=comm, data_wait_frac=wait, util_pct=util)


def test_synchronised_ranks_straggler_found_from_comm_wait():
    # every rank's step takes 100 ms (they meet in the all-reduce); rank 2 hardly waits
    windows = [_w(0, 0.1, comm=0.05), _w(1, 0.1, comm=0.048), _w(2, 0.1, comm=0.002), _w(3, 0.1, comm=0.051)]
    assert [w.rank for w, _ in stragglers(windows)] == [2]


def test_no_straggler_below_ratio_and_patience_needed():
    even = [_w(r, 0.1 + 0.01 * r) for r in range(4)]  # 130 ms vs median 110 ms: 1.18x
    assert stragglers(even) == []
    tracker = HealthTracker(patience=2)
    slow = [_w(0, 0.1), _w(1, 0.1), _w(2, 0.2), _w(3, 0.1)]
    assert tracker.update(slow, step=50) == []           # one window is not "stays"
    found = tracker.update(slow, step=100)
    assert [(f.kind, f.rank, f.host) for f in found] == [("straggler", 2, "node0")]
    assert "2.0x" in found[0].message and "--exclude" in found[0].hint
    assert tracker.update(slow, step=150) == []          # reported once
    tracker2 = HealthTracker(patience=2)
    tracker2.update(slow)
    assert tracker2.update([_w(r, 0.1) for r in range(4)]) == []  # recovered: streak reset


def test_idle_device_cause_depends_on_data_wait():
    tracker = HealthTracker()
    found = tracker.update([_w(0, 0.1, wait=0.6, util=10.0), _w(1, 0.1, wait=0.0, util=15.0),
                            _w(2, 0.1, util=90.0), _w(3, 0.1, util=None)])
    kinds = {f.rank: f for f in found}
    assert set(kinds) == {0, 1}
    assert "data loader" in kinds[0].message and "num_workers" in kinds[0].hint
    assert "not the data loader" in kinds[1].message and "batch size" in kinds[1].hint


def _node_window(rank, node, device_id, wait=0.0, samples=None, host="h"):
    return RankWindow(rank=rank, host=host, device=f"cuda:{rank % 2}", step_s=0.1, data_wait_frac=wait,
                      node=node, device_id=device_id, node_samples=samples)


def test_node_sampler_figures_reach_every_rank_of_its_node():
    # two nodes of two ranks on one host name (as on a test cluster): node 0 samples, node 1 does not
    node0 = {"available": True, "devices": {"4": {"util_pct": 95.0, "samples": 2}, "5": {"util_pct": 8.0, "samples": 2}},
             "aliases": {"GPU-abc": "5"}}
    windows = attach_samples([
        _node_window(0, 0, "4", samples=node0), _node_window(1, 0, "GPU-abc", wait=0.7),
        _node_window(2, 1, "4", samples={"available": False, "reason": "nvidia-ml-py not installed"}),
        _node_window(3, 1, "5", wait=0.7)])
    assert [w.util_pct for w in windows] == [95.0, 8.0, None, None]
    found = HealthTracker().update(windows, step=100)
    assert [(f.kind, f.rank, f.host) for f in found] == [("idle", 1, "h")]
    assert "GPU 5 of the node" in found[0].message and "data loader" in found[0].message
    assert "num_workers" in found[0].hint and "stage" in found[0].hint


def test_lookup_explains_missing_figures():
    snap = {"available": True, "devices": {"0": {"util_pct": 50.0, "samples": 1}}}
    assert lookup(snap, "0")["util_pct"] == 50.0
    assert "not among the 1 sampled" in lookup(snap, "3")["reason"]
    assert lookup(None, "0") == {"available": False, "reason": "no sampler on this node"}
    assert lookup(snap, None)["reason"].startswith("no GPU")


def test_idle_cause_agrees_with_the_data_wait_it_quotes():
    """On an H200: NVML 8%, data wait 25%, 3.5 ms steps. The old text said "not the data loader
    (little data wait)"; the wait explains a quarter of the idle time, the step the rest."""
    window = RankWindow(rank=0, host="h", device="cuda:0", step_s=0.0035, data_wait_frac=0.25,
                        util_pct=8.0, num_workers=2)
    [found] = HealthTracker().update([window], step=200)
    assert "busy only 8%" in found.message and "little data wait" not in found.message
    assert "mostly the step itself (3.5 ms a step)" in found.message
    assert "data loader, waited for 25% of the time" in found.message
    assert "batch size" in found.hint and "num_workers (now 2)" in found.hint
    # a wait that is most of the idle time is the loader's, whatever its size
    mostly = RankWindow(rank=0, host="h", device="cuda:0", step_s=0.01, data_wait_frac=0.2, util_pct=75.0)
    cause, hint = idle_cause(mostly)
    assert cause.startswith("the data loader: 20%") and "num_workers" in hint
    little = RankWindow(rank=0, host="h", device="cuda:0", step_s=0.01, data_wait_frac=0.04, util_pct=5.0)
    cause, hint = idle_cause(little)
    assert "not the data loader (data wait 4%)" in cause and "num_workers" not in hint


def test_a_window_without_a_reading_of_its_own_names_no_idle_device():
    """The sampler's first reading is taken before training (an idle GPU): a window that has
    no reading since (samples 0, the latest repeated) gives no utilisation."""
    stale = {"available": True, "devices": {"0": {"util_pct": 0.0, "samples": 0}}}
    fresh = {"available": True, "devices": {"0": {"util_pct": 8.0, "samples": 3}}}
    [w] = attach_samples([_node_window(0, 0, "0", samples=stale)])
    assert w.util_pct is None and HealthTracker().update([w]) == []
    [w] = attach_samples([_node_window(0, 0, "0", samples=fresh)])
    assert w.util_pct == 8.0
