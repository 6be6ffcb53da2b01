"""How many bytes of model state each rank holds: parameters, gradients, optimizer state.

The accounting is the ZeRO paper's (Rajbhandari et al., 2020, section 3.1), which is what
decides how many GPUs a model needs before activations are counted:

- fp32 training: 4 bytes of parameters + 4 of gradients + the optimizer's state
  (Adam: two fp32 moments = 8; SGD with momentum: 4; plain SGD: 0).
- mixed precision (bf16/fp16): 2 bytes of low-precision parameters + 2 of gradients + the
  optimizer state, which now also holds the fp32 master copy of the weights: Adam
  4 + 4 + 4 = 12 (the paper's K = 12), SGD with momentum 4 + 4 = 8, plain SGD 4.
  Both layouts cost 16 bytes per parameter with Adam. PyTorch's FSDP2 with a bf16 policy
  keeps the sharded parameters and gradients in fp32 instead of a separate master copy;
  the total per parameter is the same, split differently between the rows.

Sharding divides rows by the number of ranks that share them:

=========  ===========  ===========  ===============  =================================
strategy   parameters   gradients    optimizer state  note
=========  ===========  ===========  ===============  =================================
none/ddp   1            1            1                every rank holds a full replica
zero1      1            1            1/W              ZeroRedundancyOptimizer
zero2      1            1/W          1/W              parameters gathered during a step
zero3/fsdp 1/W          1/W          1/W
hsdp       1/S          1/S          1/S              S = shard group size (a node)
offload    0 (device)   0 (device)   0 (device)       1/W of each row on the host instead
pipeline   1/P          1/P          1/P              P = pipeline stages (even split)
=========  ===========  ===========  ===============  =================================

Not counted: activations (they depend on batch and sequence length), the transient
full-size parameters FSDP gathers for one module at a time, communication buffers (DDP's
gradient buckets add up to one more gradient copy unless ``gradient_as_bucket_view=True``),
and the allocator's fragmentation. Leave headroom for those.

This module never imports torch: ``scaletrain plan --params 7e9`` uses it on a login node.
When a model is passed, its ``parameters()`` are counted through the model's own methods.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from collections.abc import Collection
from typing import Any

from scaletrain import settings
from scaletrain.errors import UsageError
from scaletrain.parallel import options
from scaletrain.parallel.options import PRECISION_ALIASES, PRECISIONS, StrategySpec

__all__ = [
    "MemoryEstimate",
    "STRATEGIES",
    "estimate_memory",
    "format_bytes",
    "min_world_size",
    "parse_param_count",
]

# optimizer state in bytes per parameter, not counting a master copy of the weights
_OPTIMIZER_STATE: dict[str, int] = {
    "adam": 8, "adamw": 8,           # exp_avg + exp_avg_sq, fp32
    "sgd_momentum": 4, "momentum": 4,  # momentum buffer
    "rmsprop": 4, "adagrad": 4, "lion": 4,
    "sgd": 0,
}
_MASTER_WEIGHT_BYTES = 4  # fp32 copy kept by mixed-precision optimizers
# estimate_memory()'s world size, declared in the settings vocabulary (scaletrain.settings)
WORLD_SIZE = settings.Spec(doc="pass the number of ranks (GPUs) in the job, e.g. world_size=8",
                           check=settings.count())
MAX_PARAMS = 10**15   # a quadrillion parameters, as plan's --params
OPTIONS = {
    "shard_size": settings.Spec(doc="hsdp: ranks in one shard group (a node); leave it out for all",
                                check=settings.count(), optional=True),
    "pipeline_stages": settings.Spec(doc="pipeline: number of stages; leave it out for one per rank",
                                     check=settings.count(), optional=True),
    "n_trainable": settings.Spec(doc="trainable parameters of a count; leave it out for all of them",
                                 check=settings.count(low=0, high=MAX_PARAMS), optional=True),
}

# every name of the strategy vocabulary that lays model state out (``auto`` only picks one)
STRATEGIES: tuple[str, ...] = (
    *(name for name, spec in options.STRATEGIES.items() if spec.engine != "auto"),
    *(alias for alias, name in options.ALIASES.items() if options.STRATEGIES[name].engine != "auto"),
)


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Per-rank bytes of model state for one strategy (activations not included).

    Attributes:
        n_params: parameters in the model (unique tensors, all of them).
        n_trainable: parameters that get gradients and optimizer state.
        strategy, optimizer, precision, world_size: the inputs, normalised.
        params: bytes of parameters on each rank's device.
        grads: bytes of gradients on each rank's device.
        optimizer_state: bytes of optimizer state on each rank's device (with the fp32
            master weights under mixed precision).
        total: ``params + grads + optimizer_state``, device bytes per rank.
        host: bytes per rank kept in host memory instead (``offload``), else 0.
        shard_factor: how many ranks share one copy of the sharded rows (1 = replicated).
        replica: bytes of one full, unsharded copy of the model state.
    """

    n_params: int
    n_trainable: int
    strategy: str
    optimizer: str
    precision: str
    world_size: int
    params: int
    grads: int
    optimizer_state: int
    total: int
    host: int = 0
    shard_factor: int = 1
    replica: int = 0

    @property
    def bytes_per_param(self) -> float:
        """Unsharded bytes per parameter (16 for Adam in fp32 or mixed precision)."""
        return self.replica / self.n_params if self.n_params else 0.0

    def describe(self) -> str:
        """One line: ``zero3 x8, adam bf16, 7B params: 13.0 GiB/rank (params 1.6 GiB, ...)``."""
        host = f", host {format_bytes(self.host)}" if self.host else ""
        return (f"{self.strategy} x{self.world_size}, {self.optimizer} {self.precision}, "
                f"{_count(self.n_params)} params: {format_bytes(self.total)}/rank "
                f"(params {format_bytes(self.params)}, grads {format_bytes(self.grads)}, "
                f"optimizer {format_bytes(self.optimizer_state)}{host})")

    def table(self) -> str:
        """A small aligned table of the rows, for ``plan`` output and logs."""
        rows = [("parameters", self.params), ("gradients", self.grads),
                ("optimizer state", self.optimizer_state), ("total (device)", self.total)]
        if self.host:
            rows.append(("host (offloaded)", self.host))
        head = (f"{self.strategy} on {self.world_size} rank(s), {self.optimizer}, "
                f"{self.precision}, {self.n_params:,} parameters; bytes per rank:")
        body = [f"  {name:<17} {format_bytes(value):>10}" for name, value in rows]
        return "\n".join([head, *body])


def format_bytes(n: float) -> str:
    """Human-readable size in powers of 1024: ``13.0 GiB``, ``512 B``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _count(n: int) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_param_count(text: str | int | float, what: str = "the parameter count") -> int:
    """``"7e9"``, ``"7B"``, ``"350M"``, ``"1.5b"``, ``7e9`` -> an integer parameter count
    (UsageError naming ``what`` otherwise)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        try:
            value = float(text)
        except OverflowError:   # 10**400: no float, and far past any model
            value = math.inf
    elif not isinstance(text, str):
        raise UsageError(f"{what} must be a model or a parameter count, got {type(text).__name__}",
                         hint="pass the model, or its size as 7e9, 7B, 350M or 125000000")
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*",
                             str(text))
        if not match:
            raise UsageError(f"cannot read {what} from {text!r}",
                             hint="write it as 7e9, 7B, 350M or 125000000")
        value = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if not math.isfinite(value) or not 0 < value <= MAX_PARAMS:
        raise UsageError(f"{what} must be from 1 to {MAX_PARAMS:g}, got {str(text)[:40]!r}",
                         hint="write it as 7e9, 7B, 350M or 125000000")
    return int(round(value))


def _count_parameters(model: Any) -> tuple[int, int]:
    """(all, trainable) parameter counts of a module, each shared tensor counted once.

    DTensor parameters report their global ``numel()``, so a model already sharded by
    FSDP counts as the full model.
    """
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = int(p.numel())
        total += n
        if getattr(p, "requires_grad", True):
            trainable += n
    return total, trainable


def _optimizer_name(optimizer: Any) -> str:
    """A name from an optimizer object (duck-typed: no torch import), or the string given."""
    if isinstance(optimizer, str):
        return optimizer
    inner = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer wraps the real one
    target = inner if inner is not None and hasattr(inner, "defaults") else optimizer
    name = type(target).__name__.lower()
    if name == "sgd":
        momentum = (getattr(target, "defaults", {}) or {}).get("momentum", 0) or 0
        return "sgd_momentum" if momentum else "sgd"
    return name


def _norm_choice(value: str, known: Collection[str], what: str,
                 aliases: dict[str, str] | None = None) -> str:
    if not isinstance(value, str):   # None read as "none" was the strategy of that name
        raise UsageError(f"{what} must be a name, got {value!r}", hint=f"use one of: {', '.join(known)}")
    key = value.strip().lower()
    key = (aliases or {}).get(key, key.replace("-", "_"))
    if key not in known:
        raise UsageError(f"unknown {what} {value!r}",
                         hint=f"use one of: {', '.join(known)}")
    return key


def estimate_memory(model_or_n_params: Any, optimizer: str = "adam", precision: str = "fp32",
                    strategy: str = "ddp", world_size: int = 1, *,
                    grad_accum_dtype: str | None = None, shard_size: int | None = None,
                    pipeline_stages: int | None = None,
                    n_trainable: int | None = None) -> MemoryEstimate:
    """Bytes per rank of parameters, gradients and optimizer state (the ZeRO accounting).

    Args:
        model_or_n_params: a parameter count (``7e9``, ``"7B"``) or an ``nn.Module``.
            Given a number, torch is not imported.
        optimizer: ``adam``/``adamw`` (2 moments), ``sgd_momentum`` (1 buffer), ``sgd``
            (none), or ``rmsprop``/``adagrad``/``lion`` (1 buffer); or an optimizer object,
            named after its class (SGD with momentum > 0 counts as ``sgd_momentum``).
        precision: ``fp32``/``tf32`` (4-byte parameters and gradients) or ``bf16``/``fp16``
            (mixed precision: 2-byte parameters and gradients plus fp32 master weights).
        strategy: one of ``STRATEGIES``; ``auto`` is not a layout, ask for each candidate.
        world_size: ranks in the job (W).
        grad_accum_dtype: ``"fp32"`` to keep gradients in fp32 under mixed precision
            (4 bytes instead of 2); default: the precision's own width.
        shard_size: for ``hsdp``, ranks in one shard group (a node); default W.
        pipeline_stages: for ``pipeline``, number of stages P; default W (no data parallel).
        n_trainable: trainable parameters when given a count (default: all of them).

    Returns:
        A frozen ``MemoryEstimate``; ``.total`` is device bytes per rank.

    Raises:
        UsageError: an unknown name or a world/shard/stage size that does not fit.
    """
    for name, value in (("shard_size", shard_size), ("pipeline_stages", pipeline_stages),
                        ("n_trainable", n_trainable)):
        settings.check_value(OPTIONS[name], value, f"estimate_memory(): {name}")
    n_params, trainable = _counts(model_or_n_params, n_trainable)
    opt = _norm_choice(_optimizer_name(optimizer), _OPTIMIZER_STATE, "optimizer")
    prec = _norm_choice(precision, PRECISIONS, "precision", PRECISION_ALIASES)
    strat = _norm_choice(strategy, STRATEGIES, "strategy")
    settings.check_value(WORLD_SIZE, world_size, "estimate_memory(): world_size")

    width = PRECISIONS[prec].value_bytes
    mixed = width < 4
    grad_width = width
    if grad_accum_dtype is not None:
        grad_width = PRECISIONS[_norm_choice(grad_accum_dtype, PRECISIONS, "grad_accum_dtype",
                                             PRECISION_ALIASES)].value_bytes
    opt_per_param = _OPTIMIZER_STATE[opt] + (_MASTER_WEIGHT_BYTES if mixed else 0)
    replica = (n_params * width, trainable * grad_width, trainable * opt_per_param)
    (params, grads, state), host, shard = _per_rank(
        options.resolve_strategy(strat), replica, world_size, shard_size=shard_size,
        pipeline_stages=pipeline_stages)
    return MemoryEstimate(n_params=n_params, n_trainable=trainable, strategy=strat,
                          optimizer=opt, precision=prec, world_size=world_size, params=params,
                          grads=grads, optimizer_state=state, total=params + grads + state,
                          host=host, shard_factor=shard, replica=sum(replica))


def _counts(model_or_n_params: Any, n_trainable: int | None) -> tuple[int, int]:
    """(all, trainable) parameters of a model or of a count (``7e9``, ``"7B"``)."""
    if hasattr(model_or_n_params, "parameters"):
        n_params, counted_trainable = _count_parameters(model_or_n_params)
        return n_params, counted_trainable if n_trainable is None else n_trainable
    n_params = parse_param_count(model_or_n_params, "estimate_memory(): model_or_n_params")
    return n_params, n_params if n_trainable is None else n_trainable


Rows = tuple[int, int, int]  # bytes of parameters, gradients, optimizer state


def _per_rank(spec: StrategySpec, replica: Rows, w: int, *, shard_size: int | None,
              pipeline_stages: int | None) -> tuple[Rows, int, int]:
    """(device rows, host bytes, shard factor) of one rank: the spec's flags say what is split."""
    params, grads, state = replica
    if spec.engine == "pipeline" or spec.hybrid:  # every row over the stages / a node's shards
        parts = _parts(spec, w, pipeline_stages if spec.engine == "pipeline" else shard_size)
        return (_split(params, parts), _split(grads, parts), _split(state, parts)), 0, parts
    if spec.offload:
        return (0, 0, 0), _split(params, w) + _split(grads, w) + _split(state, w), w
    if not spec.shard_optimizer:  # none, ddp: a full replica on every rank
        if spec.engine == "none" and w != 1:
            raise UsageError(f"strategy 'none' runs one process, not {w}",
                             hint="use world_size=1, or strategy 'ddp' for several ranks")
        return replica, 0, 1
    return ((_split(params, w) if spec.shard_params else params),
            (_split(grads, w) if spec.shard_grads else grads), _split(state, w)), 0, w


def _parts(spec: StrategySpec, w: int, asked: int | None) -> int:
    """The ranks one copy is split over (default W); UsageError when they do not divide W."""
    parts = w if asked is None else asked
    if parts >= 1 and w % parts == 0:
        return parts
    if spec.engine == "pipeline":
        raise UsageError(f"{parts} pipeline stages do not divide world size {w}",
                         hint="make the world size a multiple of the number of stages")
    raise UsageError(f"hsdp shard group size {parts} does not divide world size {w}",
                     hint="use the number of GPUs per node as shard_size")


def _split(n_bytes: int, parts: int) -> int:
    # a shard is rounded up: FSDP pads each tensor to a multiple of the group size
    return -(-n_bytes // parts)


def min_world_size(model_or_n_params: Any, device_bytes: float, *, strategy: str = "zero3",
                   optimizer: str = "adam", precision: str = "fp32",
                   reserve_fraction: float = 0.2, max_world_size: int = 65536,
                   **kwargs: Any) -> int | None:
    """The smallest world size whose per-rank model state fits in ``device_bytes``.

    ``reserve_fraction`` of the device is kept for activations and buffers (default 20%).
    Returns None when no world size up to ``max_world_size`` fits: ``none`` and ``ddp``
    replicate the whole model, so a model that does not fit one device never fits.
    """
    budget = device_bytes * (1.0 - reserve_fraction)
    strat = _norm_choice(strategy, STRATEGIES, "strategy")
    spec = options.resolve_strategy(strat)
    replicated = spec.engine in ("none", "ddp") and not spec.shard_optimizer
    sizes = [1] if replicated else range(1, max_world_size + 1)
    for w in sizes:
        try:
            est = estimate_memory(model_or_n_params, optimizer=optimizer, precision=precision,
                                  strategy=strat, world_size=w, **kwargs)
        except UsageError:
            continue  # e.g. an hsdp shard size that does not divide this w
        if est.total <= budget:
            return w
        if spec.engine != "pipeline":  # a pipeline's stages split every row
            if not spec.shard_grads and est.params + est.grads > budget:
                return None  # zero1: only the optimizer state shrinks
            if not spec.shard_params and est.params > budget:
                return None  # zero2: the parameters never shrink
    return None
