"""One vocabulary: every table that names a strategy or a precision agrees with parallel/options.py.

The memory estimator, ``plan``'s memory table and ``--precision`` choices, the DeepSpeed and
Accelerate config generators and ``setup()``'s type hints each name strategies or precisions;
these tests fail when one of them names something the vocabulary does not know, misses a name
it should take, or maps a name onto a framework setting that shards something else.
"""

from __future__ import annotations

import argparse
import ast
import typing
from pathlib import Path

import pytest

from scaletrain.cli.plan import add_plan_arguments
from scaletrain.errors import UsageError
from scaletrain.frameworks import accelerate, deepspeed
from scaletrain.parallel import memory, options, setup
from scaletrain.parallel.options import (
    ALIASES,
    PRECISION_ALIASES,
    PRECISIONS,
    STRATEGIES,
    resolve_precision,
    resolve_strategy,
)
from scaletrain.plan import jobfiles, summary

OUR_NAMES = set(STRATEGIES) | set(ALIASES)


def _plan_choices(dest: str) -> tuple[str, ...]:
    parser = argparse.ArgumentParser()
    add_plan_arguments(parser)
    action = next(a for a in parser._actions if a.dest == dest)
    assert action.choices is not None
    return tuple(action.choices)


def test_aliases_name_strategies_of_the_vocabulary() -> None:
    assert set(ALIASES.values()) <= set(STRATEGIES)
    assert not set(ALIASES) & set(STRATEGIES)
    assert all(spec.name == name for name, spec in STRATEGIES.items())
    assert set(PRECISION_ALIASES.values()) <= set(PRECISIONS)
    assert all(spec.name == name for name, spec in PRECISIONS.items())
    assert set(options.AUTO_ORDER) <= set(STRATEGIES)


def test_memory_estimator_takes_every_strategy_with_a_layout_and_no_other() -> None:
    laid_out = {n for n in OUR_NAMES if resolve_strategy(n).engine != "auto"}
    assert set(memory.STRATEGIES) == laid_out
    for name in laid_out:
        est = memory.estimate_memory(1e6, strategy=name, world_size=1)
        assert est.total + est.host == est.replica == 16e6   # one rank holds it all, Adam fp32
    with pytest.raises(UsageError, match="unknown strategy 'auto'"):
        memory.estimate_memory(1e6, strategy="auto")


def test_memory_estimator_takes_every_precision() -> None:
    for name in [*PRECISIONS, *PRECISION_ALIASES]:
        spec = resolve_precision(name)
        est = memory.estimate_memory(1000, optimizer="sgd", precision=name)
        assert est.precision == spec.name
        assert est.params == 1000 * spec.value_bytes


def test_plan_memory_table_names_strategies_of_the_vocabulary() -> None:
    assert summary.TABLE_STRATEGIES
    assert set(summary.TABLE_STRATEGIES) <= set(STRATEGIES)
    assert set(summary.TABLE_STRATEGIES) <= set(memory.STRATEGIES)


def test_cli_precision_choices_are_the_runtimes() -> None:
    choices = _plan_choices("precision")
    assert choices == tuple(PRECISIONS)
    assert all(resolve_precision(c).name == c for c in choices)
    assert set(jobfiles.PRECISIONS) == set(PRECISIONS)


def test_framework_configs_take_every_precision() -> None:
    assert set(accelerate._PRECISION) == set(PRECISIONS)
    for name, spec in PRECISIONS.items():
        ds = deepspeed.deepspeed_config("zero2", precision=name)
        assert ("bf16" in ds) == (spec.compute_dtype == "bfloat16")
        assert ("fp16" in ds) == (spec.compute_dtype == "float16")
        acc = accelerate.accelerate_config("ddp", precision=name)
        assert (acc["mixed_precision"] == "no") == (spec.compute_dtype is None)


def _zero_stage(name: str) -> int:
    spec = resolve_strategy(name)
    return 3 if spec.shard_params else 2 if spec.shard_grads else 1 if spec.shard_optimizer else 0


@pytest.mark.parametrize("name", [n for n in deepspeed._STAGE if n not in deepspeed.OWN_NAMES])
def test_deepspeed_names_are_ours_and_shard_what_ours_shard(name: str) -> None:
    assert name in OUR_NAMES
    spec = resolve_strategy(name)
    config = deepspeed.deepspeed_config(name)
    assert config["zero_optimization"]["stage"] == _zero_stage(name)
    assert ("offload_param" in config["zero_optimization"]) == spec.offload


def test_deepspeed_names_own_or_ours() -> None:
    assert set(deepspeed.STRATEGIES) <= set(deepspeed._STAGE)
    assert not set(deepspeed.OWN_NAMES) & OUR_NAMES   # a name of DeepSpeed's own is not one of ours
    assert set(deepspeed.OWN_NAMES) <= set(deepspeed.STRATEGIES)


def test_accelerate_names_are_ours_or_what_ours_stand_for() -> None:
    for name in accelerate.STRATEGIES:
        assert name in OUR_NAMES or name in {accelerate.canonical(n) for n in OUR_NAMES}, name


@pytest.mark.parametrize("name", sorted(n for n in accelerate.STRATEGIES if n in OUR_NAMES))
def test_accelerate_settings_shard_what_ours_shard(name: str) -> None:
    spec = resolve_strategy(name)
    config = accelerate.accelerate_config(name, num_processes=4)
    assert (config["distributed_type"] == "MULTI_GPU") == (spec.engine == "ddp")
    if spec.engine == "fsdp":
        fsdp = config["fsdp_config"]
        expected = ("HYBRID_SHARD" if spec.hybrid else "FULL_SHARD" if spec.shard_params
                    else "SHARD_GRAD_OP")
        assert fsdp["fsdp_sharding_strategy"] == expected
        assert fsdp["fsdp_offload_params"] == spec.offload


def test_setup_type_hints_spell_the_vocabulary_exactly() -> None:
    """setup()'s Literal types are the one copy of the names a type checker needs: every
    strategy then every alias of options.py, in its order, split by what setup() returns."""
    names = [*STRATEGIES, *ALIASES]
    pipeline = tuple(n for n in names if resolve_strategy(n).engine == "pipeline")
    assert pipeline
    assert typing.get_args(setup.DataParallelName) == tuple(n for n in names if n not in pipeline)
    assert typing.get_args(setup.PipelineName) == pipeline
    tree = ast.parse(Path(setup.__file__).read_text(encoding="utf-8"))
    hints = [ast.unparse(arg.annotation) for node in tree.body
             if isinstance(node, ast.FunctionDef) and node.name == "setup"
             and any(ast.unparse(d) == "overload" for d in node.decorator_list)
             for arg in node.args.kwonlyargs if arg.arg == "strategy" and arg.annotation is not None]
    assert hints[:2] == ["PipelineName", "DataParallelName"]   # the overloads use them


@pytest.mark.parametrize("name", sorted(OUR_NAMES))
def test_framework_generators_take_every_name_of_ours_they_can_express(name: str) -> None:
    """A strategy or alias added to options.py reaches the DeepSpeed and Accelerate configs by
    what it shards, with no list of names there to extend; one neither can express is refused."""
    spec = resolve_strategy(name)
    if spec.shard_optimizer and not spec.hybrid:
        assert deepspeed.deepspeed_config(name)["zero_optimization"]["stage"] == _zero_stage(name)
        assert name in deepspeed.STRATEGIES or name in ALIASES
    else:
        with pytest.raises(UsageError, match="no equivalent"):
            deepspeed.deepspeed_config(name)
    if spec.engine == "fsdp" or (spec.engine == "ddp" and not spec.shard_optimizer):
        assert accelerate.accelerate_config(name)["distributed_type"] in ("MULTI_GPU", "FSDP")
        assert name in accelerate.STRATEGIES
    else:
        with pytest.raises(UsageError, match="no equivalent"):
            accelerate.accelerate_config(name)
