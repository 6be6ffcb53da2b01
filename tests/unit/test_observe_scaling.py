"""The scaling model's arithmetic, checked against hand-computed values."""

from __future__ import annotations

import pytest

from scaletrain.clusters.profile import load_profile
from scaletrain.observe.overhead import NONE
from scaletrain.observe.scaling import (Links, StepProfile, billed_gpus, comm_time, links_from_profile,
                                        predict, recommend, sizes_up_to, time_to_solution)

# the communication and contention arithmetic alone; the overhead term has its own tests
# (test_scaling_overhead.py)


def test_ring_allreduce_time():
    # 1 GB at 10 GB/s on 4 devices: 2 * 3/4 * 0.1 s = 0.15 s, plus 6 latency steps
    assert comm_time(10**9, 4, 10.0, 0.0) == pytest.approx(0.15)
    assert comm_time(10**9, 4, 10.0, 1e-3) == pytest.approx(0.156)
    assert comm_time(10**9, 1, 10.0, 1e-3) == 0.0


def test_prediction_with_and_without_overlap():
    step = StepProfile(compute_s=0.3, grad_bytes=10**9, samples_per_step=32)
    links = Links(intra_gbs=10.0, inter_gbs=1.0, devices_per_node=4, latency_s=0.0, overlap=0.0)
    p2 = predict(step, links, 2, overhead=NONE)          # one node: 2*1/2*1e9/10e9 = 0.1 s
    assert p2.comm_s == pytest.approx(0.1) and p2.step_s == pytest.approx(0.4)
    assert p2.efficiency == pytest.approx(0.75) and p2.limit == "communication"
    p8 = predict(step, links, 8, overhead=NONE)          # two nodes: 2*7/8*1 s = 1.75 s
    assert p8.nodes == 2 and p8.comm_s == pytest.approx(1.75)
    full = Links(intra_gbs=10.0, inter_gbs=1.0, devices_per_node=4, latency_s=0.0, overlap=1.0)
    # backward = 2/3 * 0.3 = 0.2 s hides all of the 0.1 s
    assert predict(step, full, 2, overhead=NONE).step_s == pytest.approx(0.3)
    # a hidden all-reduce is not a free step: the limit beyond one device is never "compute-bound"
    assert predict(step, full, 2, overhead=NONE).limit != "none (compute-bound)"
    assert predict(step, full, 1).limit == "none (compute-bound)"
    assert predict(step, full, 8, overhead=NONE).exposed_comm_s == pytest.approx(1.55)


def test_cpu_contention_and_recommendation():
    step = StepProfile(compute_s=0.1, grad_bytes=0)
    links = Links(intra_gbs=1.0, inter_gbs=None, devices_per_node=64, latency_s=0.0, slots=2)
    preds = [predict(step, links, n, overhead=NONE) for n in sizes_up_to(8)]
    assert [round(p.efficiency, 3) for p in preds] == [1.0, 1.0, 0.5, 0.25]
    assert preds[2].limit == "shared CPU cores"
    assert recommend(preds).n == 2
    assert recommend(preds, threshold=0.2).n == 8


def test_time_to_solution_and_billing():
    step = StepProfile(compute_s=1.0, grad_bytes=0, samples_per_step=10)
    links = Links(intra_gbs=1.0, inter_gbs=1.0, devices_per_node=4, whole_nodes=True)
    p = predict(step, links, 2, overhead=NONE)
    assert time_to_solution(p, step, samples=1000, startup_s=5) == pytest.approx(5 + 50)
    assert billed_gpus(2, links) == 4 and billed_gpus(5, links) == 8
    assert sizes_up_to(16, include=(6,)) == [1, 2, 4, 6, 8, 16]


def test_links_from_profiles():
    jw = links_from_profile(load_profile("juwels-booster"))
    assert jw.intra_gbs == pytest.approx(4800 / 8 * 0.4) and jw.inter_gbs == pytest.approx(80.0)
    assert jw.devices_per_node == 4 and jw.whole_nodes
    assert links_from_profile(load_profile("local")) is None


def test_cpu_contention_on_a_shared_machine():
    step = StepProfile(compute_s=0.1, grad_bytes=0)
    busy = Links(intra_gbs=1.0, inter_gbs=None, devices_per_node=64, latency_s=0.0, slots=2, background_load=14.0)
    # alone: 1 of 15 runnable threads; with 4 of ours, 4 of 18: each runs 18/15 = 1.2x slower
    assert predict(step, busy, 4, overhead=NONE).step_s == pytest.approx(0.1 * 18 / 15)
    assert predict(step, busy, 4, overhead=NONE).efficiency == pytest.approx(15 / 18)
