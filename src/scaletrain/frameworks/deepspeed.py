"""A DeepSpeed ZeRO config (JSON) from our strategy and precision.

Stages and offload targets as the Alliance guide's DeepSpeed examples use them: ZeRO-3 on GPU,
ZeRO-3 with optimizer state and parameters offloaded to the CPU, and offloaded to NVMe on the
node's local disk. DeepSpeed needs the per-GPU micro-batch and the accumulation steps as
numbers when it is used without Hugging Face's integration, so they are arguments here.
"""

from __future__ import annotations

from typing import Any

from scaletrain.errors import UsageError
from scaletrain.fileio import json_text
from scaletrain.parallel.options import ALIASES, PRECISIONS, STRATEGIES as OUR_STRATEGIES, StrategySpec


def zero_stage(spec: StrategySpec) -> int | None:
    """DeepSpeed's ZeRO stage for what our strategy shards, or None where ZeRO has no equivalent
    (ddp and none replicate, hsdp replicates across nodes, pipeline and auto are not a layout)."""
    if spec.hybrid or not spec.shard_optimizer:
        return None
    return 3 if spec.shard_params else 2 if spec.shard_grads else 1


# Names of DeepSpeed's own, beside ours: ZeRO-3 offloaded to node-local disk (no PyTorch engine).
_OWN_STAGE: dict[str, int] = {"nvme": 3}
OWN_NAMES: tuple[str, ...] = tuple(_OWN_STAGE)
# name -> ZeRO stage: our strategies (parallel/options.py) that ZeRO can express, each followed
# by its aliases, then DeepSpeed's own names
_STAGE: dict[str, int] = {
    alias: stage
    for name, spec in OUR_STRATEGIES.items() if (stage := zero_stage(spec)) is not None
    for alias in (name, *(a for a, target in ALIASES.items() if target == name))}
_STAGE.update(_OWN_STAGE)
STRATEGIES: tuple[str, ...] = (*(n for n in _STAGE if n in OUR_STRATEGIES), *OWN_NAMES)


def deepspeed_config(strategy: str, *, micro_batch_per_gpu: int | None = 1,
                     gradient_accumulation_steps: int = 1, precision: str = "fp32",
                     nvme_path: str | None = None,
                     gradient_clipping: float | None = None) -> dict[str, Any]:
    """The DeepSpeed config for ``strategy`` (``zero1``..``zero3``, ``offload``, ``nvme``).

    ``nvme`` needs ``nvme_path``: a folder on node-local NVMe (e.g. ``$LOCAL_SCRATCH`` on CSC's
    machines, ``$SLURM_TMPDIR`` on the Alliance's), never a shared file system.
    ``micro_batch_per_gpu=None`` leaves the micro-batch out, for Lightning's DeepSpeedStrategy,
    which fills it in from the program's DataLoader.
    """
    if strategy not in _STAGE:
        raise UsageError(f"DeepSpeed has no equivalent of strategy {strategy!r}",
                         f"use one of {', '.join(_STAGE)} with DeepSpeed")
    if (micro_batch_per_gpu is not None and micro_batch_per_gpu < 1) or gradient_accumulation_steps < 1:
        raise UsageError("micro-batch per GPU and accumulation steps must be at least 1",
                         "e.g. micro_batch_per_gpu=8, gradient_accumulation_steps=1")
    if strategy == "nvme" and not nvme_path:
        raise UsageError("ZeRO offload to NVMe needs the path of a node-local disk",
                         "e.g. nvme_path='$LOCAL_SCRATCH' (CSC) or '$SLURM_TMPDIR' (Alliance)")
    zero: dict[str, Any] = {"stage": _STAGE[strategy], "overlap_comm": True,
                            "contiguous_gradients": True}
    ours = OUR_STRATEGIES.get(ALIASES.get(strategy, strategy))
    if ours is not None and ours.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    elif strategy == "nvme":
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True}
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True}
    config: dict[str, Any] = {}
    if micro_batch_per_gpu is not None:
        config["train_micro_batch_size_per_gpu"] = micro_batch_per_gpu
    config["gradient_accumulation_steps"] = gradient_accumulation_steps
    config["zero_optimization"] = zero
    if strategy == "nvme":
        config["aio"] = {"block_size": 1048576, "queue_depth": 8, "single_submit": False,
                         "overlap_events": True}
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    elif precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}", f"use one of {', '.join(PRECISIONS)}")
    if gradient_clipping is not None:
        config["gradient_clipping"] = gradient_clipping
    return config


def to_json(config: dict[str, Any]) -> str:
    """The config as DeepSpeed reads it (``--deepspeed_config FILE``)."""
    return json_text(config, indent=2) + "\n"
