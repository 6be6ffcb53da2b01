"""Unit tests for scaletrain.setup(): strategy table, degrees, options, precision, accumulation.

No process group here: an explicit ``Env`` is passed, and on a world of one the data-parallel
strategies run unwrapped. The multi-process numbers are in tests/multiproc.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import scaletrain
from scaletrain.errors import StrategyError
from scaletrain.parallel import auto, fsdp, optim
from scaletrain.parallel.options import (
    STRATEGIES,
    ParallelDims,
    StrategyOptions,
    dims_for,
    resolve_precision,
    resolve_strategy,
)
from scaletrain.parallel.precision import state_of
from scaletrain.runtime.env import Env

ONE = Env()  # rank 0 of 1 on the CPU


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


# --- strategy table and degrees --------------------------------------------------------


def test_unknown_strategy_lists_the_known_ones():
    with pytest.raises(StrategyError) as info:
        resolve_strategy("zero4")
    for name in ("ddp", "zero1", "zero2", "zero3", "hsdp", "offload", "pipeline", "auto", "fsdp"):
        assert name in info.value.hint


def test_aliases_and_case():
    assert resolve_strategy("FSDP").name == "zero3"
    assert resolve_strategy(" zero2 ").name == "zero2"


def test_strategy_specs_are_the_zero_stages():
    z = {name: STRATEGIES[name] for name in ("ddp", "zero1", "zero2", "zero3", "offload")}
    assert [s.shard_optimizer for s in z.values()] == [False, True, True, True, True]
    assert [s.shard_grads for s in z.values()] == [False, False, True, True, True]
    assert [s.shard_params for s in z.values()] == [False, False, False, True, True]
    assert not z["zero2"].reshard_after_forward and z["zero3"].reshard_after_forward
    assert STRATEGIES["hsdp"].hybrid and STRATEGIES["offload"].offload


def test_parallel_dims_must_multiply_to_the_world():
    assert ParallelDims(world_size=8, replicate=2, shard=4).data_parallel == 8
    assert ParallelDims(world_size=8, replicate=2, shard=4).mesh_shape == (2, 4)
    assert ParallelDims(world_size=4, shard=4).mesh_shape == (4,)
    with pytest.raises(StrategyError, match="but the world has 8"):
        ParallelDims(world_size=8, replicate=3, shard=2)
    with pytest.raises(StrategyError):
        ParallelDims(world_size=0)


def test_hsdp_mesh_defaults_to_nodes_by_local_ranks():
    spec = resolve_strategy("hsdp")
    dims = dims_for(spec, world_size=8, local_world_size=4, num_nodes=2)
    assert (dims.replicate, dims.shard) == (2, 4)
    dims = dims_for(spec, world_size=4, local_world_size=4, num_nodes=1, mesh_shape=(2, 2))
    assert dims.mesh_shape == (2, 2)


def test_hsdp_mesh_not_matching_world_says_what_fits():
    with pytest.raises(StrategyError) as info:
        dims_for(resolve_strategy("hsdp"), world_size=4, local_world_size=4, num_nodes=1,
                 mesh_shape=(3, 2))
    assert "6 ranks" in info.value.message and "(1, 4)" in info.value.hint


def test_mesh_shape_only_for_hsdp():
    with pytest.raises(StrategyError, match="hsdp only"):
        dims_for(resolve_strategy("zero3"), world_size=4, local_world_size=4, num_nodes=1,
                 mesh_shape=(2, 2))


def test_options_are_validated():
    with pytest.raises(StrategyError):
        StrategyOptions(bucket_cap_mb=0)
    with pytest.raises(StrategyError):
        StrategyOptions(wrap=("Block",))
    assert StrategyOptions(wrap=nn.Linear).wrap == (nn.Linear,)


def test_unknown_option_is_an_error():
    with pytest.raises(StrategyError, match="bucket_size"):
        scaletrain.setup(_model(), None, strategy="ddp", env=ONE, bucket_size=10)


# --- FSDP wrapping plan ----------------------------------------------------------------


def test_wrap_targets_by_size_and_by_class():
    model = _model()  # Linear sizes 288, 1056, 132
    by_size = fsdp.wrap_targets(model, min_params=1000, wrap=None)
    assert by_size == [model[2]]
    assert fsdp.wrap_targets(model, min_params=10**9, wrap=None) == []
    outer = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Linear(2, 2))
    by_class = fsdp.wrap_targets(outer, min_params=0, wrap=(nn.Sequential, nn.Linear))
    # bottom-up: the inner Linear before the Sequential that contains it
    assert by_class.index(outer[0][0]) < by_class.index(outer[0])
    assert outer not in by_class


# --- setup() on one process ------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "hsdp", "none"])
def test_world_of_one_runs_unwrapped(strategy):
    model, opt = _model(), None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    got_model, got_opt = scaletrain.setup(model, opt, strategy=strategy, env=ONE)
    assert got_model is model and got_opt is opt
    state = state_of(got_model)
    assert state.strategy.name == "none" and state.dims.world_size == 1
    if strategy != "none":
        assert "running unwrapped" in state.notes[0]


def test_none_on_several_processes_warns():
    env = Env(world_size=2, local_world_size=2, rank=1, local_rank=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaletrain.setup(_model(), None, strategy="none", env=env)
    assert any("not averaged" in str(w.message) for w in caught)


def test_nccl_with_two_ranks_on_one_gpu_is_refused():
    env = Env(world_size=2, local_world_size=2, backend="nccl", device="cuda:0")
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has two GPUs")
    with pytest.raises(StrategyError) as info:
        scaletrain.setup(_model(), None, strategy="ddp", env=env)
    assert "--procs-per-gpu" in info.value.hint


def test_zero1_needs_an_optimizer():
    env = Env(world_size=2, local_world_size=2)
    with pytest.raises(StrategyError, match="no optimizer"):
        scaletrain.setup(_model(), None, strategy="zero1", env=env)


def test_fsdp_without_process_group_says_how_to_start():
    env = Env(world_size=2, local_world_size=2)
    with pytest.raises(StrategyError) as info:
        scaletrain.setup(_model(), None, strategy="zero3", env=env)
    assert "scaletrain run" in info.value.hint


# --- optimizer rebuild -----------------------------------------------------------------


def test_rebuild_keeps_class_and_per_group_hyper_parameters():
    model = _model()
    weights = [p for p in model.parameters() if p.ndim == 2]
    biases = [p for p in model.parameters() if p.ndim == 1]
    opt = torch.optim.AdamW([{"params": weights, "weight_decay": 0.1},
                             {"params": biases, "weight_decay": 0.0, "lr": 1e-4}],
                            lr=1e-3, betas=(0.8, 0.9))
    names = optim.param_names(model)
    groups = optim.hyper_groups(opt, names)
    new = {n: nn.Parameter(p.detach().clone()) for n, p in model.named_parameters()}
    rebuilt = optim.rebuild(opt, groups, new)
    assert type(rebuilt) is torch.optim.AdamW
    assert [g["weight_decay"] for g in rebuilt.param_groups] == [0.1, 0.0]
    assert [g["lr"] for g in rebuilt.param_groups] == [1e-3, 1e-4]
    assert rebuilt.param_groups[0]["betas"] == (0.8, 0.9)
    assert all(any(p is q for q in new.values()) for g in rebuilt.param_groups
               for p in g["params"])


def test_rebuild_rejects_foreign_tensors():
    model = _model()
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1)
    with pytest.raises(StrategyError, match="not parameters of the model"):
        optim.hyper_groups(opt, optim.param_names(model))


# --- precision -------------------------------------------------------------------------


def test_unknown_precision():
    with pytest.raises(StrategyError) as info:
        resolve_precision("int8")
    assert "bf16" in info.value.hint
    assert resolve_precision("bf16-mixed").name == "bf16"


def test_tf32_sets_the_two_flags():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        scaletrain.setup(_model(), None, strategy="none", precision="tf32", env=ONE)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_bf16_autocast_inside_fp32_outside():
    model, _ = scaletrain.setup(_model(), None, strategy="none", precision="bf16", env=ONE)
    seen = []
    model[2].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    out = model(torch.randn(5, 8))
    assert seen == [torch.bfloat16] and out.dtype == torch.float32
    assert next(model.parameters()).dtype == torch.float32  # master weights stay fp32


def test_fp16_scales_the_loss_and_refuses_plain_backward():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = scaletrain.setup(model, opt, strategy="none", precision="fp16", env=ONE)
    scaler = state_of(model).scaler
    assert type(scaler).__name__ == "GradScaler"
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.randn(4, 8)).float().pow(2).mean()
    scaletrain.backward(loss, model)
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.zero_grad()
    model(torch.randn(4, 8)).float().pow(2).mean().backward()
    with pytest.raises(StrategyError, match="not scaled"):
        opt.step()


def test_accumulate_syncs_on_the_last_micro_step_and_averages():
    x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
    ref = _model()
    F.cross_entropy(ref(x), y).backward()
    model, _ = scaletrain.setup(_model(), None, strategy="none", env=ONE)
    acc = scaletrain.accumulate(model, steps=2)
    flags = []
    for xm, ym in zip(x.chunk(2), y.chunk(2)):
        with acc:
            scaletrain.backward(F.cross_entropy(model(xm), ym), model)
        flags.append(acc.sync)
    assert flags == [False, True] and acc.micro_step == 0
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    with pytest.raises(StrategyError):
        scaletrain.accumulate(model, steps=0)


# --- auto ------------------------------------------------------------------------------


def test_auto_picks_the_cheapest_strategy_that_fits():
    model = nn.Linear(1000, 1000)  # ~1e6 params; Adam fp32: 16 MB as ddp
    opt = torch.optim.Adam(model.parameters())
    env = Env(world_size=4, local_world_size=4)
    big = auto.choose(model, opt, env, "fp32", device_bytes=10**9)
    assert big.strategy == "ddp" and "ddp" in big.reason()
    mid = auto.choose(model, opt, env, "fp32", device_bytes=12 * 10**6)
    assert mid.strategy in ("zero2", "zero3") and list(mid.estimates)[0] == "ddp"
    tiny = auto.choose(model, opt, env, "fp32", device_bytes=1000)
    assert tiny.strategy == "offload"
    assert auto.optimizer_kind(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)) \
        == "sgd_momentum"


def test_auto_through_setup_prints_why(capsys):
    model = _model()
    scaletrain.setup(model, torch.optim.Adam(model.parameters()), strategy="auto", env=ONE)
    assert "strategy auto -> ddp" in capsys.readouterr().out


def test_parallel_modules_do_not_import_torch_at_import():
    code = ("import sys, scaletrain.parallel.options, scaletrain.parallel.auto, "
            "scaletrain.parallel.setup, scaletrain.parallel.precision; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_setup_without_a_model_is_a_usage_error():
    from scaletrain.errors import UsageError

    with pytest.raises(UsageError) as info:
        scaletrain.setup(None, None, env=ONE)
    assert "model" in str(info.value) and "setup(model" in info.value.hint
    with pytest.raises(UsageError, match="got a str"):
        scaletrain.setup("resnet50", env=ONE)
    model = _model()
    with pytest.raises(UsageError, match="optimizer"):
        scaletrain.setup(model, model, env=ONE)  # arguments swapped or mistyped


def test_mesh_dims_follow_the_degrees_in_one_order():
    from scaletrain.parallel.strategy import mesh_dims

    assert mesh_dims(ParallelDims(world_size=8, replicate=8)) == (("replicate",), (8,))
    assert mesh_dims(ParallelDims(world_size=8, replicate=2, shard=4)) == \
        (("replicate", "shard"), (2, 4))
    assert mesh_dims(ParallelDims(world_size=8, shard=2, pipeline=4)) == \
        (("shard", "pipeline"), (2, 4))
    assert mesh_dims(ParallelDims(world_size=1), primary="shard") == (("shard",), (1,))
    # a pipeline with FSDP across its replicas shards, with DDP it replicates
    spec = resolve_strategy("pipeline")
    assert dims_for(spec, world_size=8, local_world_size=8, num_nodes=1, pipeline_stages=2,
                    pipeline_sharded=True) == ParallelDims(world_size=8, shard=4, pipeline=2)
    assert dims_for(spec, world_size=8, local_world_size=8, num_nodes=1,
                    pipeline_stages=2) == ParallelDims(world_size=8, replicate=4, pipeline=2)


def test_describe_a_world_of_one():
    from scaletrain.parallel import describe

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert describe(model) is None  # not set up
    model, opt = scaletrain.setup(model, opt, strategy="zero3", env=ONE)
    sharding = describe(model)
    assert sharding is not None and describe(opt) is sharding
    assert (sharding.strategy, sharding.params, sharding.optimizer) == \
        ("none", "replicated", "replicated")
    assert not sharding.sharded and sharding.mesh is None and sharding.group("shard") is None


def test_parallel_package_imports_no_torch():
    code = "import sys, scaletrain.parallel; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"
