"""The memory estimator's arithmetic, against numbers worked out by hand (ZeRO accounting)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scaletrain.errors import UsageError
from scaletrain.parallel.memory import (
    MemoryEstimate,
    estimate_memory,
    format_bytes,
    min_world_size,
    parse_param_count,
)


def test_7b_adam_bf16_zero3_on_8_gpus():
    # ZeRO paper: 2 (bf16 params) + 2 (bf16 grads) + 12 (fp32 master + 2 moments) = 16 B/param
    est = estimate_memory(7e9, optimizer="adam", precision="bf16", strategy="zero3", world_size=8)
    assert est.params == 7e9 * 2 / 8 == 1_750_000_000
    assert est.grads == 1_750_000_000
    assert est.optimizer_state == 7e9 * 12 / 8 == 10_500_000_000
    assert est.total == 14_000_000_000
    assert est.host == 0
    assert est.bytes_per_param == 16.0
    assert est.shard_factor == 8
    assert est.describe().startswith("zero3 x8, adam bf16, 7B params: 13.0 GiB/rank")
    assert "optimizer state      9.8 GiB" in est.table()


def test_fp32_adam_ddp_is_16_bytes_per_param_replicated():
    est = estimate_memory(1_000_000, optimizer="adam", precision="fp32", strategy="ddp",
                          world_size=4)
    assert (est.params, est.grads, est.optimizer_state) == (4_000_000, 4_000_000, 8_000_000)
    assert est.total == 16_000_000  # no saving from 4 ranks: every rank holds a replica


@pytest.mark.parametrize("strategy, expected", [
    # 1e9 params, Adam, bf16, W = 4: params 2e9, grads 2e9, optimizer 12e9 before sharding
    ("ddp", (2e9, 2e9, 12e9)),
    ("zero1", (2e9, 2e9, 3e9)),
    ("zero2", (2e9, 0.5e9, 3e9)),
    ("zero3", (0.5e9, 0.5e9, 3e9)),
    ("fsdp", (0.5e9, 0.5e9, 3e9)),
])
def test_zero_stages_shard_one_more_row_each(strategy, expected):
    est = estimate_memory(1e9, optimizer="adam", precision="bf16", strategy=strategy,
                          world_size=4)
    assert (est.params, est.grads, est.optimizer_state) == tuple(int(x) for x in expected)
    assert est.total == int(sum(expected))


def test_optimizer_state_widths():
    def per_param(opt: str, prec: str) -> float:
        return estimate_memory(1000, optimizer=opt, precision=prec).total / 1000

    assert per_param("sgd", "fp32") == 8          # 4 params + 4 grads, no state
    assert per_param("sgd_momentum", "fp32") == 12  # + 4 momentum
    assert per_param("sgd-momentum", "fp32") == 12  # spelling with a dash
    assert per_param("adamw", "fp32") == 16
    assert per_param("sgd", "bf16") == 2 + 2 + 4    # mixed precision keeps fp32 master weights
    assert per_param("sgd_momentum", "fp16") == 2 + 2 + 8
    assert per_param("adam", "tf32") == 16          # tf32 stores fp32


def test_fp32_gradient_accumulation_under_bf16():
    est = estimate_memory(1000, optimizer="adam", precision="bf16", grad_accum_dtype="fp32")
    assert (est.params, est.grads, est.optimizer_state) == (2000, 4000, 12000)


def test_offload_moves_everything_to_the_host():
    est = estimate_memory(1e9, optimizer="adam", precision="fp32", strategy="offload",
                          world_size=8)
    assert est.total == est.params == est.grads == est.optimizer_state == 0
    assert est.host == 16e9 / 8 == 2_000_000_000
    assert "host" in est.table() and "host" in est.describe()


def test_hsdp_shards_over_the_shard_group_only():
    est = estimate_memory(1e9, optimizer="adam", precision="bf16", strategy="hsdp",
                          world_size=16, shard_size=8)
    assert est.total == 16e9 / 8 == 2_000_000_000
    assert est.shard_factor == 8
    whole = estimate_memory(1e9, optimizer="adam", precision="bf16", strategy="hsdp",
                            world_size=16)  # default shard group: every rank
    assert whole.total == 1_000_000_000
    with pytest.raises(UsageError, match="does not divide") as info:
        estimate_memory(1e9, strategy="hsdp", world_size=12, shard_size=8)
    assert "per node" in info.value.hint


def test_pipeline_divides_by_the_stages():
    est = estimate_memory(1e9, optimizer="sgd_momentum", precision="fp32", strategy="pipeline",
                          world_size=4, pipeline_stages=2)
    assert est.total == 12e9 / 2 == 6_000_000_000
    assert estimate_memory(1e9, strategy="pipeline", world_size=4).total == 16e9 / 4
    with pytest.raises(UsageError, match="do not divide"):
        estimate_memory(1e9, strategy="pipeline", world_size=4, pipeline_stages=3)


def test_shards_round_up_like_padded_fsdp_shards():
    est = estimate_memory(10, optimizer="sgd", precision="fp32", strategy="zero3", world_size=3)
    assert est.params == 14  # ceil(40 / 3)


def test_trainable_subset_gets_grads_and_state_only():
    est = estimate_memory(1000, optimizer="adam", precision="fp32", n_trainable=100)
    assert (est.params, est.grads, est.optimizer_state) == (4000, 400, 800)


def test_counts_a_model_once_per_shared_tensor():
    torch = pytest.importorskip("torch")
    from torch import nn

    model = nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 10))
    model[2].weight = nn.Parameter(model[0].weight.T.contiguous())  # not shared
    assert estimate_memory(model).n_params == 55 + 60
    tied = nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, 7, bias=False))
    tied[1].weight = tied[0].weight  # tied: one tensor, counted once
    est = estimate_memory(tied, optimizer="sgd")
    assert est.n_params == 28 and est.total == 28 * 8
    tied[0].weight.requires_grad_(False)
    frozen = estimate_memory(tied, optimizer="adam")
    assert frozen.n_trainable == 0 and frozen.grads == frozen.optimizer_state == 0
    assert torch is not None


def test_optimizer_objects_are_named_by_class(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    # building a torch optimizer the first time sets this variable: give it one to keep
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    w = [torch.nn.Parameter(torch.zeros(10))]
    per = {type(o).__name__ + str(o.defaults.get("momentum", "")):
           estimate_memory(1000, optimizer=o).optimizer_state / 1000
           for o in (torch.optim.Adam(w), torch.optim.SGD(w, lr=0.1),
                     torch.optim.SGD(w, lr=0.1, momentum=0.9))}
    assert per == {"Adam": 8, "SGD0": 0, "SGD0.9": 4}
    with pytest.raises(UsageError, match="unknown optimizer"):
        estimate_memory(1000, optimizer=torch.optim.LBFGS(w))


def test_a_number_does_not_import_torch():
    code = ("import sys; from scaletrain.parallel.memory import estimate_memory; "
            "e = estimate_memory(7e9, 'adam', 'bf16', 'zero3', 8); print(e.table()); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "13.0 GiB" in proc.stdout


def test_public_name_and_frozen_result():
    import scaletrain

    est = scaletrain.estimate_memory(100)
    assert isinstance(est, MemoryEstimate)
    with pytest.raises(Exception):
        est.total = 0  # type: ignore[misc]


@pytest.mark.parametrize("text, value", [
    ("7e9", 7_000_000_000), ("7B", 7_000_000_000), ("350M", 350_000_000),
    ("1.5b", 1_500_000_000), ("125000", 125_000), (7e9, 7_000_000_000), ("2k", 2000),
])
def test_parse_param_count(text, value):
    assert parse_param_count(text) == value


@pytest.mark.parametrize("bad", ["seven", "-3", "0", "7X"])
def test_parse_param_count_rejects(bad):
    with pytest.raises(UsageError) as info:
        parse_param_count(bad)
    assert "7B" in info.value.hint


@pytest.mark.parametrize("kwargs, word", [
    ({"optimizer": "adagrad2"}, "optimizer"),
    ({"precision": "fp8"}, "precision"),
    ({"strategy": "zero4"}, "strategy"),
    ({"world_size": 0}, "world_size"),
    ({"strategy": "none", "world_size": 2}, "one process"),
])
def test_bad_inputs_raise_usage_errors_with_hints(kwargs, word):
    with pytest.raises(UsageError, match=word) as info:
        estimate_memory(1000, **kwargs)
    assert info.value.hint


def test_min_world_size():
    # 7e9 Adam mixed precision = 112e9 bytes; an 80e9-byte GPU keeps 20% for activations
    assert min_world_size(7e9, 80e9, strategy="zero3", precision="bf16") == 2
    assert min_world_size(7e9, 80e9, strategy="ddp", precision="bf16") is None
    assert min_world_size(1e8, 80e9, strategy="ddp") == 1
    # zero1: params+grads 28e9 stay; optimizer 84e9/W must drop under 64e9-28e9 = 36e9: W = 3
    assert min_world_size(7e9, 80e9, strategy="zero1", precision="bf16") == 3


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(14e9) == "13.0 GiB"
    assert format_bytes(3 * 1024**2) == "3.0 MiB"
