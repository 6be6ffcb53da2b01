"""Tier 2: scaletrain.loader and the metric helpers on 3 real processes (gloo), one launch.

20 samples over 3 ranks: evaluation shards see each sample exactly once; padded training shards
see every sample with exactly the padding duplicated and reshuffle between epochs; the metric
reductions give the right numbers; every rank resumes mid-epoch at exactly its next sample.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from workers import run_workers

pytestmark = pytest.mark.multiproc

WORLD = 3
N = 20
SCRIPT = Path(__file__).with_name("data_worker.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("data")
    proc = run_workers(SCRIPT, nproc=WORLD, args=["--out", str(out)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {"ranks": ranks, "gathered": json.loads((out / "gathered.json").read_text())}


def test_ranks_found_the_world_without_an_env(results):
    assert [(r["rank"], r["world"]) for r in results["ranks"]] == [(i, WORLD) for i in range(WORLD)]
    assert [r["loader_env"] for r in results["ranks"]] == [[i, WORLD, True] for i in range(WORLD)]
    assert {r["launcher"] for r in results["ranks"]} == {"torchrun"}  # scaletrain run's variables


def test_eval_mode_each_sample_exactly_once(results):
    seen = [i for r in results["ranks"] for i in r["eval"]]
    assert sorted(seen) == list(range(N))
    assert [len(r["eval"]) for r in results["ranks"]] == [7, 7, 6]
    assert [r["eval_batches"] for r in results["ranks"]] == [3, 3, 2]  # uneven, as documented


def test_weighted_mean_over_uneven_shards_is_exact(results):
    for r in results["ranks"]:
        # the mean of i*i over the whole dataset, 123.5
        assert r["eval_weighted_mean"] == pytest.approx(sum(i * i for i in range(N)) / N, abs=1e-9)
        # the plain mean of the shard means (117, 136, 116.5) is not: weight= matters
        assert r["eval_plain_mean"] == pytest.approx((117 + 136 + 116.5) / 3, abs=1e-9)


def test_padded_training_epoch_covers_everything_once_plus_padding(results):
    for epoch in range(2):
        count = Counter(i for r in results["ranks"] for i in r["pad_epochs"][epoch])
        assert set(count) == set(range(N))
        assert sum(count.values()) == 21  # 3 ranks x ceil(20/3); exactly one duplicate
    assert all(r["pad_len"] == 3 for r in results["ranks"])  # 7 samples, batches of 3, short last


def test_two_epochs_give_different_orders(results):
    for r in results["ranks"]:
        assert r["pad_epochs"][0] != r["pad_epochs"][1]
    shards0 = [set(r["pad_epochs"][0]) for r in results["ranks"]]
    shards1 = [set(r["pad_epochs"][1]) for r in results["ranks"]]
    assert shards0 != shards1  # samples move between ranks, not only within a rank


def test_drop_last_shards_are_disjoint_and_equal(results):
    shards = [r["drop_epoch"] for r in results["ranks"]]
    assert [len(s) for s in shards] == [6, 6, 6]  # 20 // 3 = 6 each, whole batches of 2
    assert len(set().union(*map(set, shards))) == 18


def test_all_reduce_mean_values(results):
    for r in results["ranks"]:
        assert r["mean_rank"] == pytest.approx(1.0)
        assert r["mean_tensor"] == pytest.approx([1.0, 2.0])
        assert r["mean_tensor_dtype"] == "torch.float32" and r["input_untouched"]
        assert r["mean_int_tensor"] == pytest.approx([1.0])
        assert r["weighted"] == pytest.approx((0 * 1 + 1 * 2 + 2 * 3) / (1 + 2 + 3))


def test_gather_objects_in_rank_order(results):
    gathered = results["gathered"]
    assert [g["rank"] for g in gathered] == list(range(WORLD))
    assert len({g["pid"] for g in gathered}) == WORLD
    assert [g["eval"] for g in gathered] == [r["eval"] for r in results["ranks"]]


def test_loader_and_metrics_over_a_subgroup(results):
    r0, r1, r2 = results["ranks"]
    assert r0["group_eval"] == list(range(0, N, 2)) and r1["group_eval"] == list(range(1, N, 2))
    assert r2["group_eval"] == list(range(N))
    assert (r0["group_mean"], r1["group_mean"], r2["group_mean"]) == (0.5, 0.5, 2.0)
    assert (r0["group_gather"], r1["group_gather"], r2["group_gather"]) == ([0, 1], [0, 1], [2])


def test_resume_mid_epoch_on_every_rank(results):
    for r in results["ranks"]:
        ref = r["resume_ref"]
        assert len(ref[0]) == 4  # 7 samples: batches 2,2,2,1
        assert r["resume_first"] == ref[0][:2]
        assert (r["resume_state"]["epoch"], r["resume_state"]["consumed"]) == (0, 4)
        assert r["resume_rest"] == ref[0][2:]
        assert r["resume_next"] == ref[1] and ref[1] != ref[0]
