"""Strategies and precisions as data: THE vocabulary of both, the options, the validated degrees.

Every table elsewhere that names a strategy or a precision (the memory estimator, ``plan``'s
memory table and ``--precision`` choices, the DeepSpeed and Accelerate config generators) is
derived from :data:`STRATEGIES`/:data:`ALIASES` and :data:`PRECISIONS`/:data:`PRECISION_ALIASES`
here, or checked against them by the unit tests, so a name added here reaches them all.

A strategy name resolves to a :class:`StrategySpec` (what the engine does: replicate,
shard, reshard after forward, offload) and, once the world size is known, to a
:class:`ParallelDims` (how many ranks replicate, how many shard), validated against the
world size like torchtitan's ``ParallelDims``. ``setup()`` reads these objects; it never
branches on the strategy's name. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scaletrain import settings
from scaletrain.errors import StrategyError


class StrategySettingError(settings.SettingError, StrategyError):
    """A strategy's option refused by its declaration: the vocabulary's one line, and the
    StrategyError that ``setup``/``apply`` promise for a bad option."""


# a degree of parallelism (Degrees' fields), declared in the settings vocabulary
DEGREE = settings.Spec(doc="degrees of parallelism are counts of ranks", check=settings.count(),
                       error=StrategySettingError)


@dataclass(frozen=True, kw_only=True)
class StrategySpec:
    """What one strategy asks of PyTorch's engine.

    Attributes:
        name: canonical name (``zero3``, not its alias ``fsdp``).
        engine: ``none`` (no wrapping), ``ddp`` (DistributedDataParallel), ``fsdp``
            (FSDP2 ``fully_shard``), ``pipeline`` (torch.distributed.pipelining) or
            ``auto`` (chosen later from a memory estimate).
        shard_optimizer: optimizer state sharded over data-parallel ranks (ZeRO-1 and up).
        shard_grads: gradients sharded (ZeRO-2 and up).
        shard_params: parameters stay sharded outside forward/backward (ZeRO-3).
        offload: parameters, gradients and optimizer state live in host memory.
        hybrid: shard inside a node, replicate across nodes (2-D mesh).
        summary: one line for messages and ``scaletrain plan``.
    """

    name: str
    engine: str
    shard_optimizer: bool = False
    shard_grads: bool = False
    shard_params: bool = False
    offload: bool = False
    hybrid: bool = False
    summary: str = ""

    @property
    def reshard_after_forward(self) -> bool:
        """FSDP2 frees the gathered parameters after forward only when parameters are sharded."""
        return self.shard_params


STRATEGIES: dict[str, StrategySpec] = {
    "none": StrategySpec(name="none", engine="none",
                         summary="one process, no wrapping"),
    "ddp": StrategySpec(name="ddp", engine="ddp",
                        summary="DistributedDataParallel: full replica per rank, gradients all-reduced"),
    "zero1": StrategySpec(name="zero1", engine="ddp", shard_optimizer=True,
                          summary="DDP + ZeroRedundancyOptimizer: optimizer state sharded"),
    "zero2": StrategySpec(name="zero2", engine="fsdp", shard_optimizer=True, shard_grads=True,
                          summary="FSDP2, parameters kept after forward: gradients and optimizer "
                                  "state sharded"),
    "zero3": StrategySpec(name="zero3", engine="fsdp", shard_optimizer=True, shard_grads=True,
                          shard_params=True,
                          summary="FSDP2 full sharding: parameters, gradients, optimizer state"),
    "hsdp": StrategySpec(name="hsdp", engine="fsdp", shard_optimizer=True, shard_grads=True,
                         shard_params=True, hybrid=True,
                         summary="FSDP2 sharded inside a node, replicated across nodes"),
    "offload": StrategySpec(name="offload", engine="fsdp", shard_optimizer=True, shard_grads=True,
                            shard_params=True, offload=True,
                            summary="FSDP2 full sharding with state in host memory (CPUOffloadPolicy)"),
    "pipeline": StrategySpec(name="pipeline", engine="pipeline",
                             summary="model split into stages over ranks (torch.distributed.pipelining)"),
    "auto": StrategySpec(name="auto", engine="auto",
                         summary="the first of ddp, zero2, zero3, offload that fits in memory"),
}

ALIASES: dict[str, str] = {"fsdp": "zero3", "fsdp2": "zero3", "zero": "zero3", "single": "none"}

# The order `auto` tries, cheapest communication first.
AUTO_ORDER: tuple[str, ...] = ("ddp", "zero2", "zero3", "offload")


def world_sized(spec: StrategySpec) -> bool:
    """True when the world size alone decides the strategy's layout: DDP and the ZeRO/FSDP family
    on one mesh dimension (hsdp also needs the node size, pipeline the stage count; none is one
    process and auto a choice among these)."""
    return spec.engine in ("ddp", "fsdp") and not spec.hybrid


def resolve_strategy(name: str) -> StrategySpec:
    """The spec for ``name`` (case-insensitive, aliases allowed); StrategyError lists the names."""
    if not isinstance(name, str):
        raise StrategyError(f"strategy must be a name, got {type(name).__name__}",
                            hint=f"use one of: {', '.join(STRATEGIES)}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    spec = STRATEGIES.get(key)
    if spec is None:
        known = ", ".join([*STRATEGIES, *(f"{a} (= {t})" for a, t in ALIASES.items())])
        raise StrategyError(f"unknown strategy {name!r}", hint=f"use one of: {known}")
    return spec


@dataclass(frozen=True, kw_only=True)
class PrecisionSpec:
    """One precision: its compute dtype, whether it scales the loss, whether it sets TF32."""

    name: str
    compute_dtype: str | None = None  # "bfloat16" / "float16"; None = fp32
    scaler: bool = False
    tf32: bool = False

    @property
    def value_bytes(self) -> int:
        """Bytes of one parameter or gradient the model computes with (2 when mixed, else 4)."""
        return 2 if self.compute_dtype else 4


PRECISIONS: dict[str, PrecisionSpec] = {
    "fp32": PrecisionSpec(name="fp32"),
    "tf32": PrecisionSpec(name="tf32", tf32=True),
    "bf16": PrecisionSpec(name="bf16", compute_dtype="bfloat16"),
    "fp16": PrecisionSpec(name="fp16", compute_dtype="float16", scaler=True),
}
# the spellings of Lightning and of torch dtypes, so a user's habit works
PRECISION_ALIASES: dict[str, str] = {
    "32": "fp32", "float32": "fp32", "bf16-mixed": "bf16", "bfloat16": "bf16",
    "16": "fp16", "16-mixed": "fp16", "float16": "fp16", "half": "fp16",
}


def resolve_precision(name: str) -> PrecisionSpec:
    """The spec for ``name`` (case-insensitive, aliases allowed); StrategyError lists the names."""
    key = str(name).strip().lower()
    key = PRECISION_ALIASES.get(key, key)
    spec = PRECISIONS.get(key)
    if spec is None:
        raise StrategyError(f"unknown precision {name!r}",
                            hint=f"use one of: {', '.join(PRECISIONS)}")
    return spec


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """Validated degrees of parallelism: ``replicate * shard * pipeline == world_size``.

    ``replicate`` ranks hold identical copies (DDP replicas, the outer dimension of HSDP);
    ``shard`` ranks split one copy (FSDP); ``pipeline`` ranks hold different stages.
    """

    world_size: int
    replicate: int = 1
    shard: int = 1
    pipeline: int = 1

    def __post_init__(self) -> None:
        for dim in ("world_size", "replicate", "shard", "pipeline"):
            settings.check_value(DEGREE, getattr(self, dim), dim)
        product = self.replicate * self.shard * self.pipeline
        if product != self.world_size:
            raise StrategyError(
                f"replicate {self.replicate} x shard {self.shard} x pipeline {self.pipeline} = "
                f"{product} ranks, but the world has {self.world_size}",
                hint="choose degrees whose product is the number of processes "
                     f"(e.g. mesh_shape=({self.world_size // max(self.shard, 1) or 1}, "
                     f"{self.shard}) if that divides)")

    @property
    def data_parallel(self) -> int:
        """Ranks that see different data: replicas times shards."""
        return self.replicate * self.shard

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """DeviceMesh shape for FSDP: 2-D ``(replicate, shard)`` for HSDP, else 1-D."""
        return (self.replicate, self.shard) if self.replicate > 1 and self.shard > 1 else (
            self.replicate * self.shard,)


def dims_for(spec: StrategySpec, *, world_size: int, local_world_size: int, num_nodes: int,
             mesh_shape: tuple[int, int] | None = None,
             pipeline_stages: int | None = None,
             pipeline_sharded: bool = False) -> ParallelDims:
    """The degrees a strategy implies for this world; StrategyError when they cannot fit.

    ``pipeline_stages`` (pipeline only, default: one stage per rank) leaves
    ``world_size / stages`` pipeline replicas for data parallelism: DDP replicas, or FSDP
    shards with ``pipeline_sharded`` (``data_parallel="fsdp"``).
    """
    if spec.hybrid:
        if mesh_shape is None:
            if num_nodes * local_world_size != world_size:
                raise StrategyError(
                    f"hsdp needs the same number of ranks on every node; {world_size} ranks on "
                    f"{num_nodes} nodes with {local_world_size} per node do not divide evenly",
                    hint="pass mesh_shape=(replicas, shards) explicitly")
            mesh_shape = (num_nodes, local_world_size)
        if len(mesh_shape) != 2:
            raise StrategyError(f"hsdp mesh_shape must have two entries, got {mesh_shape!r}",
                                hint="mesh_shape=(replicas, shards), e.g. (2, 2) for 4 ranks")
        replicate, shard = (int(v) for v in mesh_shape)
        if replicate * shard != world_size:
            raise StrategyError(
                f"hsdp mesh_shape {tuple(mesh_shape)} holds {replicate * shard} ranks, "
                f"but the world has {world_size}",
                hint=f"use a mesh whose product is {world_size}, e.g. "
                     f"{_factor_pair(world_size, local_world_size)}")
        return ParallelDims(world_size=world_size, replicate=replicate, shard=shard)
    if mesh_shape is not None:
        raise StrategyError(f"mesh_shape applies to hsdp only, not {spec.name}",
                            hint="drop mesh_shape, or use strategy='hsdp'")
    if spec.engine == "fsdp":
        return ParallelDims(world_size=world_size, shard=world_size)
    if spec.engine == "pipeline":
        stages = pipeline_stages or world_size
        if world_size % stages:
            raise StrategyError(f"{stages} pipeline stages do not divide {world_size} ranks",
                                hint="use a number of stages that divides the world size")
        if pipeline_sharded:
            return ParallelDims(world_size=world_size, pipeline=stages,
                                shard=world_size // stages)
        return ParallelDims(world_size=world_size, pipeline=stages,
                            replicate=world_size // stages)
    return ParallelDims(world_size=world_size, replicate=world_size)


def _factor_pair(world_size: int, preferred_shard: int) -> tuple[int, int]:
    shard = preferred_shard if preferred_shard > 0 and world_size % preferred_shard == 0 else 1
    return (world_size // shard, shard)


@dataclass(kw_only=True)
class StrategyOptions:
    """Knobs for the strategies; each one is ignored by strategies it does not concern.

    Attributes:
        bucket_cap_mb: DDP gradient bucket size in MiB (PyTorch's default 25 when None).
        static_graph: DDP ``static_graph`` (the graph is the same every step).
        find_unused_parameters: DDP looks for parameters that got no gradient (slower).
        min_params: FSDP wraps each child module holding at least this many parameters
            (not already covered by a wrapped descendant), then the root.
        wrap: FSDP wraps every module of these classes instead (e.g. transformer blocks).
        mesh_shape: HSDP ``(replicas, shards)``; default ``(num_nodes, ranks per node)``.
        extra: strategy-specific options passed through (the pipeline strategy's).
    """

    # the knobs with a value of their own, in the settings vocabulary (a refusal names setup()'s keyword)
    bucket_cap_mb: float | None = settings.setting(
        "DDP's gradient bucket in MiB; 25 is PyTorch's default", default=None, unit="MiB",
        check=settings.number(above=0, high=1e6), error=StrategySettingError)
    static_graph: bool = settings.setting("DDP: the graph is the same every step", default=False,
                                          check=settings.boolean(), error=StrategySettingError)
    find_unused_parameters: bool = settings.setting("DDP looks for parameters without a gradient", default=False,
                                                    check=settings.boolean(), error=StrategySettingError)
    min_params: int = settings.setting("FSDP wraps children of at least this many parameters, e.g. 1_000_000",
                                       default=1_000_000, check=settings.count(low=0, high=10**15),
                                       error=StrategySettingError)
    wrap: tuple[type, ...] | None = None
    mesh_shape: tuple[int, int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        settings.check_fields(self, owner="setup()")
        if self.wrap is not None:
            wrap = (self.wrap,) if isinstance(self.wrap, type) else tuple(self.wrap)
            bad = [w for w in wrap if not isinstance(w, type)]
            if bad:
                raise StrategyError(f"wrap must list module classes, got {bad!r}",
                                    hint="e.g. wrap=[TransformerBlock]")
            self.wrap = wrap
        if self.mesh_shape is not None:
            self.mesh_shape = tuple(self.mesh_shape)  # type: ignore[assignment]
