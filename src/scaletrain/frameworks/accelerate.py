"""An Accelerate config (``accelerate launch --config_file``) from our strategy and precision.

The fields and values are the ones the CSC machine-learning guide shows for DDP and FSDP
(``distributed_type: MULTI_GPU`` / ``FSDP`` with ``fsdp_config``); the counts are the job's.
"""

from __future__ import annotations

from typing import Any

from scaletrain.errors import UsageError

# name -> (Accelerate distributed_type, FSDP sharding strategy, offload parameters). The names
# say what Accelerate is told: FSDP's sharding strategies, not DeepSpeed's ZeRO stages; each one
# is one of our strategies (parallel/options.py) or what one of ALIASES' names stands for, and a
# unit test checks that the settings agree with what our strategy of that name shards.
_STRATEGIES: dict[str, tuple[str, str | None, bool]] = {
    "ddp": ("MULTI_GPU", None, False),
    "fsdp-shard-grad-op": ("FSDP", "SHARD_GRAD_OP", False),
    "fsdp-full-shard": ("FSDP", "FULL_SHARD", False),
    "fsdp-offload": ("FSDP", "FULL_SHARD", True),
    "hsdp": ("FSDP", "HYBRID_SHARD", False),
}
# the older names, kept so existing commands keep working (zero2/zero3 were never DeepSpeed here)
ALIASES: dict[str, str] = {"zero2": "fsdp-shard-grad-op", "zero3": "fsdp-full-shard",
                           "fsdp": "fsdp-full-shard", "offload": "fsdp-offload"}
STRATEGIES: tuple[str, ...] = tuple(_STRATEGIES) + tuple(ALIASES)


def canonical(strategy: str) -> str:
    """The name for what ``strategy`` writes (``zero3`` -> ``fsdp-full-shard``)."""
    return ALIASES.get(strategy, strategy)


# our precision (parallel/options.py PRECISIONS, a unit test checks) -> Accelerate's mixed_precision
_PRECISION = {"fp32": "no", "tf32": "no", "bf16": "bf16", "fp16": "fp16"}


def accelerate_config(strategy: str, *, precision: str = "fp32", num_machines: int = 1,
                      num_processes: int = 1, cpu: bool = False,
                      main_process_port: int = 29500) -> dict[str, Any]:
    """The settings of an Accelerate config file for ``strategy`` on the job's size.

    ``num_processes`` is the total over all machines (Accelerate's meaning). Raises UsageError
    for a strategy Accelerate cannot express (``zero1``, ``pipeline``).

    ``cpu``: ``accelerate launch`` starts one process per machine for ``MULTI_CPU`` (it expects
    mpirun to start the rest), so several CPU processes are written as ``MULTI_GPU`` with
    ``use_cpu``, and the job exports ``ACCELERATE_USE_CPU=true`` (scaletrain's plan does): the
    launcher then starts them all and each one runs on the CPU.
    """
    strategy = canonical(strategy)
    if strategy not in _STRATEGIES:
        raise UsageError(f"Accelerate has no equivalent of strategy {strategy!r}",
                         f"use one of {', '.join(_STRATEGIES)} with Accelerate "
                         "(ZeRO-1: --launcher deepspeed with --deepspeed-config)")
    if precision not in _PRECISION:
        raise UsageError(f"unknown precision {precision!r}", f"use one of {', '.join(_PRECISION)}")
    kind, sharding, offload = _STRATEGIES[strategy]
    if cpu:
        if kind != "MULTI_GPU":
            raise UsageError(f"Accelerate runs {strategy} (FSDP) on GPUs only",
                             "use --strategy ddp for a CPU job")
        kind = "MULTI_GPU" if num_processes > 1 else "NO"
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": kind,
        "downcast_bf16": "no", "gpu_ids": "all", "machine_rank": 0,
        "main_training_function": "main", "main_process_port": main_process_port,
        "mixed_precision": _PRECISION[precision], "num_machines": num_machines,
        "num_processes": num_processes, "rdzv_backend": "static", "same_network": True,
        "use_cpu": cpu,
    }
    if sharding is not None:
        config["fsdp_config"] = {
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_backward_prefetch_policy": "BACKWARD_PRE", "fsdp_forward_prefetch": False,
            "fsdp_cpu_ram_efficient_loading": True, "fsdp_offload_params": offload,
            "fsdp_sharding_strategy": sharding, "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_sync_module_states": True, "fsdp_use_orig_params": True,
        }
    return config


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"  # single-quoted YAML: only ' is special


def to_yaml(config: dict[str, Any], indent: int = 0) -> str:
    """Block-style YAML for a mapping of scalars and nested mappings (what the configs hold)."""
    lines = []
    for key, value in config.items():
        pad = " " * indent
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines.append(to_yaml(value, indent + 2).rstrip("\n"))
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return "\n".join(lines) + "\n"
