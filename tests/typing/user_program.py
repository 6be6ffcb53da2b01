"""A small training program as users write it, type-checked against scaletrain and never run.

tests/unit/test_typing.py runs mypy on it with ``disallow_any_expr``: an expression whose
type is ``Any`` is an error here, so a public scaletrain name that loses its type (a lazy
export without its TYPE_CHECKING import, a ``-> Any`` signature) fails the check, and each
``assert_type`` pins what a user's IDE shows. The ``type: ignore`` lines must be needed
(``warn_unused_ignores``): they prove that arguments are typed, not ``Any``.
"""

from __future__ import annotations

from typing import assert_type

import torch
from torch.utils.data import TensorDataset

import scaletrain
from scaletrain import Env
from scaletrain.data.loader import DistributedLoader
from scaletrain.parallel import Layout, Sharding, describe
from scaletrain.parallel.memory import MemoryEstimate
from scaletrain.parallel.pipeline import PipelineModel
from scaletrain.parallel.precision import Accumulator


def train(strategy_name: str) -> None:
    env = scaletrain.init(device="cpu", timeout_s=60)
    assert_type(env, Env)
    assert_type(scaletrain.detect(), Env)
    assert_type((env.rank, env.world_size, env.device, env.is_main), tuple[int, int, str, bool])
    scaletrain.init(device=0)  # type: ignore[arg-type]

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=scaletrain.scale_lr(1e-3, 64, 256))
    wrapped, opt = scaletrain.setup(model, optimizer, strategy="zero3", precision="bf16")
    assert_type(wrapped, torch.nn.Module)
    assert_type(opt, torch.optim.Optimizer)
    bare, no_opt = scaletrain.setup(model)
    assert_type(no_opt, None)
    pipe, pipe_opt = scaletrain.setup(model, optimizer, strategy="pipeline", split_points=["2"])
    assert_type(pipe, PipelineModel)
    either, either_opt = scaletrain.setup(model, optimizer, strategy=strategy_name)
    assert_type(either, torch.nn.Module | PipelineModel)
    assert_type(either_opt, torch.optim.Optimizer)

    sharding = describe(wrapped)
    assert_type(sharding, Sharding | None)
    if sharding is not None and sharding.sharded:
        assert_type(sharding.layout_of(opt), Layout)

    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = scaletrain.loader(data, global_batch_size=16)
    assert_type(loader, DistributedLoader)
    acc = scaletrain.accumulate(wrapped, steps=2)
    assert_type(acc, Accumulator)
    loader.set_epoch(1)  # (batches are torch's Any: not checked here)
    logits = torch.randn(16, 2, requires_grad=True)  # model(x) is Any to torch's own stubs
    with acc:
        loss = torch.nn.functional.cross_entropy(logits, torch.randint(0, 2, (16,)))
        scaletrain.backward(loss)
    if acc.sync:
        opt.step()
        opt.zero_grad()
    assert_type(scaletrain.all_reduce_mean(loss.detach()), float | torch.Tensor)
    step_loss = pipe.step(torch.randn(16, 8), torch.randint(0, 2, (16,)))
    assert_type(step_loss, torch.Tensor | None)

    assert_type(scaletrain.estimate_memory(model, strategy="zero3", world_size=8),
                MemoryEstimate)
    with scaletrain.main_first():
        scaletrain.rank_print("ready", ranks="all")
    scaletrain.print("the same function as rank_print")
    scaletrain.barrier()
    scaletrain.shutdown()
