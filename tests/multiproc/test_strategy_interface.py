"""Every strategy behind one interface: ``scaletrain.parallel.describe()`` after ``setup()``
tells which state is split over ranks, how, and over which mesh - for the pipeline too -
and agrees with the objects themselves. The pipeline trains in bf16. One 4-rank launch."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers import launch_json

from scaletrain.torch_features import fsdp_on_cpu

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("strategy_worker.py")


FSDP_CASES = ("zero3", "hsdp", "pipeline_fsdp")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    return launch_json(WORKER, 4, tmp_path_factory.mktemp("strategy"))


def _runs(ranks: dict, case: str) -> bool:
    """False for an FSDP case on a torch without FSDP2 on the CPU (2.6): then every rank was
    refused with the one line that names the torch it needs."""
    if case not in FSDP_CASES or fsdp_on_cpu():
        return True
    assert all("needs torch 2.7 or newer" in got["refused"] for got in ranks[case]), ranks[case]
    return False


def _skip_unless_runs(ranks: dict, case: str) -> None:
    if not _runs(ranks, case):
        pytest.skip(f"{case}: FSDP2 on the CPU needs torch 2.7 or newer (refused as expected)")


@pytest.mark.parametrize("case, params, optimizer, mesh_dims, groups", [
    ("ddp", "replicated", "replicated", ["replicate"], {"replicate": 4}),
    ("zero1", "replicated", "partitioned", ["replicate"], {"replicate": 4}),
    ("zero3", "sharded", "sharded", ["shard"], {"shard": 4}),
    ("hsdp", "sharded", "sharded", ["replicate", "shard"], {"replicate": 2, "shard": 2}),
    ("pipeline_ddp", "staged", "staged", ["replicate", "pipeline"],
     {"replicate": 2, "pipeline": 2}),
    ("pipeline_fsdp", "staged", "staged", ["shard", "pipeline"], {"shard": 2, "pipeline": 2}),
])
def test_describe_names_layouts_and_the_one_mesh(ranks, case, params, optimizer, mesh_dims,
                                                 groups):
    _skip_unless_runs(ranks, case)
    for rank, got in enumerate(ranks[case]):
        assert (got["params"], got["optimizer"]) == (params, optimizer), (case, rank, got)
        assert got["optimizer_of_opt"] == optimizer  # the optimizer answers the same
        assert got["mesh_dims"] == mesh_dims and got["group_sizes"] == groups
        assert got["sharded"] == ((params, optimizer) != ("replicated", "replicated"))
        # the mesh is built from the degrees: replicate x shard x pipeline == 4
        r, s, p = got["dims"]
        assert r * s * p == 4 and got["mesh_shape"] == [n for n in (r, s, p) if n > 1]


@pytest.mark.parametrize("case", ["ddp", "zero1", "zero3", "hsdp", "pipeline_ddp",
                                  "pipeline_fsdp"])
def test_describe_agrees_with_the_objects(ranks, case):
    _skip_unless_runs(ranks, case)
    for got in ranks[case]:
        # DTensor parameters exactly where describe() says sharded (FSDP2 in the stage too)
        assert got["dtensor_params"] == ("sharded" in (got["params"], got["within_stage"]))
        assert got["zero_optimizer"] == (got["optimizer"] == "partitioned")


def test_pipeline_stages_and_data_ranks(ranks):
    for dp, within in (("pipeline_ddp", "replicated"), ("pipeline_fsdp", "sharded")):
        if not _runs(ranks, dp):
            continue
        for rank, got in enumerate(ranks[dp]):
            assert (got["stage"], got["n_stages"], got["data_rank"]) == (rank % 2, 2, rank // 2)
            assert got["within_stage"] == within
            # each stage owns different parameters, under the model's own names
            assert got["owned"] == (["0.bias", "0.weight"] if rank % 2 == 0 else
                                    ["2.bias", "2.weight", "4.bias", "4.weight"])
    for case in filter(lambda case: _runs(ranks, case), ("ddp", "zero1", "zero3", "hsdp")):
        assert all(g["stage"] is None and g["within_stage"] is None for g in ranks[case])


def test_pipeline_trains_in_bf16(ranks):
    for rank, got in enumerate(ranks["pipeline_bf16"]):
        assert got["compute_dtypes"] == ["torch.bfloat16"], got  # the stage computes in bf16
        assert got["param_dtypes"] == ["torch.float32"]  # master weights stay fp32
        fp32 = got["fp32_losses"]
        assert ranks["pipeline_fp32"][rank]["compute_dtypes"] == ["torch.float32"]
        # bf16 keeps 8 bits of mantissa: the losses follow fp32 closely, not exactly
        assert all(abs(a - b) < 2e-2 * abs(b) for a, b in zip(got["losses"], fp32)), got
        assert got["losses"] != fp32


def test_pipeline_fp16_is_refused_with_the_reason(ranks):
    for got in ranks["pipeline_fp16"]:
        assert got["error"] == "StrategyError"
        assert "cannot be scaled" in got["text"] and "bf16" in got["text"]
