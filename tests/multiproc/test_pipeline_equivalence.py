"""Pipeline parallelism gives the same model as one process (issue 4 acceptance).

Two launches: 2 ranks (2 stages, 4 micro-batches; GPipe and 1F1B; SGD with momentum and
Adam; the examples' CNN traced and split by name, a transformer split as a Sequential and
from explicit stage modules) and 4 ranks (2 stages x 2 data-parallel replicas, DDP and
FSDP). Global batch 64, 5 steps, parameters within 1e-5 of one process. Each launch also
runs a deliberately broken variant that the same check must reject.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers import run_workers

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("pipeline_worker.py")
TOL = 1e-5

CASES_2 = ["cnn_gpipe_sgd", "cnn_gpipe_adam", "cnn_1f1b_sgd", "cnn_1f1b_adam",
           "tf_gpipe_adam", "tf_1f1b_sgd", "tf_1f1b_adam_stages"]
CASES_4 = ["cnn_gpipe_sgd", "tf_1f1b_adam_stages", "tf_1f1b_adam_fsdp"]


def _launch(nproc: int, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(f"pipeline{nproc}") / "results.json"
    proc = run_workers(WORKER, nproc=nproc, args=["--out", str(out)], timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    return _launch(2, tmp_path_factory)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> dict:
    return _launch(4, tmp_path_factory)


def _check_equal(case: dict) -> None:
    assert case["keys_match"], "gathered parameter names differ from the model's"
    assert case["moved"] > 1e-3, "training barely changed the parameters: a vacuous check"
    assert case["max_param_diff"] < TOL, case
    assert case["max_loss_diff"] < TOL, case
    # evaluate() matches the gathered model; load_full_state_dict() round-trips
    assert case["eval_diff"] < TOL, case


@pytest.mark.parametrize("name", CASES_2)
def test_two_stages_equal_one_process(two_ranks, name):
    assert two_ranks["world"] == 2
    _check_equal(two_ranks["cases"][name])


@pytest.mark.parametrize("name", CASES_4)
def test_two_stages_times_two_replicas_equal_one_process(four_ranks, name):
    assert four_ranks["world"] == 4
    _check_equal(four_ranks["cases"][name])


def test_dropping_a_microbatch_is_caught(two_ranks):
    case = two_ranks["cases"]["broken_drop_microbatch"]
    assert case["max_param_diff"] > 1e-3


def test_not_averaging_replicas_is_caught(four_ranks):
    case = four_ranks["cases"]["broken_no_replica_average"]
    assert case["max_param_diff"] > 1e-3


def test_each_rank_optimizes_only_its_stage(two_ranks, four_ranks):
    for results in (two_ranks, four_ranks):
        for case in results["cases"].values():
            assert 0 < case["optimizer_params"] < case["model_params"]
            assert case["optimizer_params"] == case["owned"]


def test_stage_ownership_is_reported(two_ranks):
    case = two_ranks["cases"]["cnn_1f1b_sgd"]
    owners = case["stage_of"]
    assert {k for k, s in owners.items() if s == 0} == {
        "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"}
    assert {k.split(".")[0] for k, s in owners.items() if s == 1} == {"fc1", "fc2", "fc3"}
    assert "stage 0: conv1.weight" in case["describe"]
    assert "Schedule1F1B" in case["describe"]
    tf = two_ranks["cases"]["tf_1f1b_adam_stages"]["stage_of"]
    assert tf["0.weight"] == 0 and tf["4.weight"] == 1  # explicit stages keep model names


@pytest.mark.parametrize("key, kind, words", [
    ("unknown_split", "StrategyError", ["fc9", "conv1, pool, conv2, fc1"]),
    ("indivisible_world", "DistEnvError", ["2 ranks", "4 stages", "multiple of 4"]),
    ("no_example", "StrategyError", ["example", "stages=[...]"]),
    ("indivisible_batch", "StrategyError", ["30 samples", "28 or 32"]),
    ("called_like_module", "StrategyError", ["pipe.step"]),
    ("traced_other_size", "StrategyError", ["traced with batches of 8", "got 16"]),
])
def test_misuse_gets_an_error_with_a_hint(two_ranks, key, kind, words):
    err = two_ranks["errors"][key]
    assert err["type"] == kind, err
    text = err["message"] + " HINT: " + err["hint"]
    for word in words:
        assert word in text, text
