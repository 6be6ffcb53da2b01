"""Every strategy trains the same numbers as one unwrapped process (issue 4's acceptance).

One launch per world size (2, 3, 4 real processes, gloo on CPU) runs all cases of that size
in ``parallel_equiv_worker.py``; the tests below read its JSON. Same seed, same data, global
batch 64, 5 optimizer steps, SGD with momentum and Adam, the CIFAR CNN and a transformer
block, two param groups with their own hyper-parameters.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from workers import run_workers

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("parallel_equiv_worker.py")
TOL = 1e-5  # fp32: summation order differs between one batch of 64 and W slices
MODELS = ("cnn", "transformer")
OPTIMIZERS = ("sgd", "adam")


def _launch(tmp_path_factory, nproc: int) -> dict:
    out = tmp_path_factory.mktemp(f"equiv{nproc}") / "results.json"
    proc = run_workers(WORKER, nproc=nproc, args=["--out", str(out)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["world_size"] == nproc
    return data["results"]


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict:
    return _launch(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def world3(tmp_path_factory) -> dict:
    return _launch(tmp_path_factory, 3)


@pytest.fixture(scope="module")
def world4(tmp_path_factory) -> dict:
    return _launch(tmp_path_factory, 4)


def _equal(results: dict, case: str, tol: float = TOL) -> dict:
    r = results[case]
    assert "error" not in r, f"{case}: {r['error']}\n{r.get('trace', '')}"
    assert r["finite"], case
    # The comparison means something only if training moved the weights well beyond tol.
    assert r["moved"] > 100 * tol, r
    assert r["diff"] <= tol, f"{case}: max |param - reference| = {r['diff']:.3g} > {tol}"
    return r


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "offload"])
def test_two_processes_equal_one(world2, strategy, model, opt):
    r = _equal(world2, f"{strategy}/{model}/{opt}")
    if strategy in ("zero2", "zero3", "offload"):
        assert r["mesh"] == [2] and "Shard(dim=0)" in r["placements"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_ddp_three_processes_uneven_slices_equal_one(world3, model, opt):
    _equal(world3, f"ddp/{model}/{opt}")  # 64 samples over 3 ranks: 22, 21, 21


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_hsdp_2x2_equal_one(world4, model, opt):
    r = _equal(world4, f"hsdp/{model}/{opt}")
    assert r["mesh"] == [2, 2]
    assert r["placements"] == "(Replicate(), Shard(dim=0))"


@pytest.mark.parametrize("case", ["fsdp-wrap-blocks/transformer/adam", "ddp-options/cnn/sgd",
                                  "ddp-plain-backward/cnn/sgd"])
def test_options_and_plain_backward_equal_one(world2, case):
    _equal(world2, case)


@pytest.mark.parametrize("case", ["accumulate-ddp/cnn/sgd", "accumulate-ddp/transformer/adam",
                                  "accumulate-zero3/cnn/sgd",
                                  "accumulate-zero3/transformer/adam"])
def test_gradient_accumulation_two_micro_steps_equal_one_batch(world2, case):
    _equal(world2, case)


def test_equivalence_check_catches_unaveraged_gradients(world2):
    """A DDP comm hook that sums instead of averaging must fail the comparison."""
    r = world2["broken-sum/cnn/sgd"]
    assert "error" not in r, r
    assert r["diff"] > 1e-3, r
    assert r["diff"] > 100 * TOL


@pytest.mark.parametrize("case", ["bf16-ddp/transformer/sgd", "bf16-zero3/transformer/sgd",
                                  "fp16-ddp/transformer/sgd", "fp16-zero3/transformer/sgd",
                                  "fp16-zero1/transformer/sgd", "bf16-offload/transformer/sgd"])
def test_mixed_precision_trains_close_to_fp32(world2, case):
    r = world2[case]
    assert "error" not in r, f"{case}: {r['error']}\n{r.get('trace', '')}"
    assert r["finite"]
    assert r["self_moved"] > 0.5 * r["moved"]  # it trained ...
    assert r["diff"] < 0.25 * r["moved"], r  # ... to nearly the fp32 weights
    assert 0 < r["diff"]  # and really computed in low precision
    if case.startswith("fp16"):
        want = "ShardedGradScaler" if "zero3" in case else "GradScaler"  # FSDP: sharded
        assert r["scaler"] == want


def test_fp16_with_plain_backward_is_refused(world2):
    r = world2["fp16-plain-backward"]
    assert r["raised"] == "StrategyError" and "scaletrain.backward" in r["hint"]


def test_ddp_unused_parameter_error_has_hint(world2):
    r = world2["ddp-unused-parameter"]
    assert r["raised"] == "StrategyError" and "find_unused_parameters=True" in r["hint"]


def test_zero3_holds_half_the_state_per_rank(world2):
    r = world2["zero3-memory"]
    assert abs(r["params"] - r["full_param_bytes"] / 2) <= 0.05 * r["full_param_bytes"]
    # Adam: two moments of the local shard only
    assert abs(r["optimizer"] - 2 * r["params"]) <= 0.05 * r["full_param_bytes"]


def test_pipeline_strategy_is_dispatched(world2):
    r = world2["pipeline-dispatch"]
    assert "error" not in r, f"{r['error']}\n{r.get('trace', '')}"
    assert r["type"] == "PipelineModel" and r["pipeline"] == 2
    assert r["diff"] <= TOL
