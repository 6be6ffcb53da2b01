"""An Accelerate config (``accelerate launch --config_file``) from our strategy and precision.

The fields and values are the ones the CSC machine-learning guide shows for DDP and FSDP
(``distributed_type: MULTI_GPU`` / ``FSDP`` with ``fsdp_config``); the counts are the job's.
"""

from __future__ import annotations

from typing import Any

from scaletrain.errors import UsageError
from scaletrain.parallel.options import ALIASES as OUR_ALIASES, STRATEGIES as OUR_STRATEGIES, StrategySpec

# What Accelerate is told: (distributed_type, FSDP sharding strategy, offload parameters).
_Settings = tuple[str, str | None, bool]


def settings(spec: StrategySpec) -> _Settings | None:
    """Accelerate's settings for what our strategy shards, or None where Accelerate has no
    equivalent (zero1 shards only the optimizer; none, pipeline and auto are not a layout)."""
    if spec.engine == "ddp" and not spec.shard_optimizer:
        return ("MULTI_GPU", None, False)
    if spec.engine != "fsdp":
        return None
    return ("FSDP", "HYBRID_SHARD" if spec.hybrid else "FULL_SHARD" if spec.shard_params
            else "SHARD_GRAD_OP", spec.offload)


# Accelerate's own names, FSDP's sharding strategies: a config is written under these rather than
# under our ZeRO-looking names, which would read as DeepSpeed. Our other names keep their own.
_OWN: dict[str, _Settings] = {
    "fsdp-shard-grad-op": ("FSDP", "SHARD_GRAD_OP", False),
    "fsdp-full-shard": ("FSDP", "FULL_SHARD", False),
    "fsdp-offload": ("FSDP", "FULL_SHARD", True),
}


def _names() -> tuple[dict[str, _Settings], dict[str, str]]:
    """(the config's name -> settings, our other names -> the config's name), from our
    strategies and aliases (parallel/options.py) that Accelerate expresses."""
    found: dict[str, _Settings] = {}
    aliases: dict[str, str] = {}
    for name in (*OUR_STRATEGIES, *OUR_ALIASES):
        value = settings(OUR_STRATEGIES[OUR_ALIASES.get(name, name)])
        if value is None:
            continue
        own = next((own for own, known in _OWN.items() if known == value), name)
        found.setdefault(own, value)
        if own != name:
            aliases[name] = own
    # as the hints list them: replicated, then sharded, then hybrid
    ordered = sorted(found.items(), key=lambda item: (item[1][1] is not None, item[1][1] == "HYBRID_SHARD"))
    return dict(ordered), aliases


_STRATEGIES, ALIASES = _names()   # ALIASES: zero3 -> fsdp-full-shard
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
