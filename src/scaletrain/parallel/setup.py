"""``scaletrain.setup()``: one call that turns a model and optimizer into a parallel pair.

The compose order is fixed (torchtitan's ``parallelize`` idea) and the same for every strategy:

1. environment: ``scaletrain.init()`` (idempotent) gives the Env and the process group;
2. validation: strategy and precision names, options, the degrees of parallelism
   (``ParallelDims``) against the world size, device sharing under NCCL; ``auto`` picks a
   strategy from the memory estimate here;
3. precision flags: TF32 for ``tf32``;
4. placement: the model moves to ``env.device`` (FSDP strategies: ``fully_shard`` moves
   each module as it shards it, and the pipeline moves only this rank's stage, so the
   unsharded model never has to fit on the device);
5. compute precision: autocast around ``forward`` (none/ddp/zero1; each pipeline stage),
   or FSDP2's MixedPrecisionPolicy passed to step 6 (zero2/zero3/hsdp/offload); fp16 with
   the pipeline is refused (its schedule runs backward, so the loss cannot be scaled);
6. the one DeviceMesh is built from the degrees (``parallel.strategy.build_mesh``) and the
   strategy's ``apply(model, optimizer, ctx)`` wraps the model (DDP, ``fully_shard``
   bottom-up, pipeline stages with DDP/FSDP2 across replicas; every strategy has this one
   shape) ...
7. ... and rebuilds the optimizer over the new parameters when they changed (ZeRO-1, FSDP2,
   pipeline stages); ``strategy.sharding()`` records which state is split over which mesh
   (``scaletrain.parallel.describe(model)``);
8. loss scaling for fp16: a scaler, and ``optimizer.step()`` that unscales/steps/updates.

On a world of one process the data-parallel strategies (ddp, zero1, zero2, zero3, hsdp) have
nothing to average or shard: the model runs unwrapped - identical numbers, no overhead - and a
note says so. ``offload`` still applies (it moves state to host memory on one GPU too).
``none`` on several processes is allowed with a warning: each rank then trains its own copy.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Literal, overload

from scaletrain import settings
from scaletrain.errors import StrategyError, UsageError
from scaletrain.parallel.options import (
    ParallelDims,
    PrecisionSpec,
    StrategyOptions,
    StrategySpec,
    dims_for,
    resolve_precision,
    resolve_strategy,
)
from scaletrain.parallel.precision import (
    ParallelState,
    apply_flags,
    attach_state,
    install_scaled_step,
    make_scaler,
    wrap_forward_autocast,
)
from scaletrain.parallel.strategy import Context, NoneStrategy, Strategy, build_mesh
from scaletrain.runtime.current import live_dist
from scaletrain.runtime.env import ENV

# setup()'s verbose, in the settings vocabulary (env: runtime.env's ENV; the strategy and the
# precision are checked by their own tables, options by parallel.options)
VERBOSE = settings.Spec(doc="True: rank 0 prints what was applied", check=settings.boolean())

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from typing_extensions import TypeVar

    from scaletrain.parallel.pipeline import PipelineModel
    from scaletrain.runtime.env import Env

    # what setup() returns as the optimizer: an Optimizer when given one (the same class,
    # or ZeroRedundancyOptimizer for zero1), None when none was given
    _Opt = TypeVar("_Opt", torch.optim.Optimizer, None, default=None)

# The strategies that return a torch.nn.Module (everything but the pipeline), and the one that
# returns a PipelineModel. A typing Literal must spell the names; a unit test ties both, name for
# name and in order, to parallel/options.py's STRATEGIES and ALIASES.
DataParallelName = Literal["none", "ddp", "zero1", "zero2", "zero3", "hsdp", "offload", "auto",
                           "fsdp", "fsdp2", "zero", "single"]
PipelineName = Literal["pipeline"]

_OPTION_NAMES = ("bucket_cap_mb", "static_graph", "find_unused_parameters", "min_params", "wrap",
                 "mesh_shape")


@overload
def setup(model: torch.nn.Module | None,  # type: ignore[overload-overlap]
          optimizer: _Opt = ..., *, strategy: PipelineName, precision: str = ...,
          env: Env | None = ..., verbose: bool = ..., **options: object
          ) -> tuple[PipelineModel, _Opt]: ...
@overload
def setup(model: torch.nn.Module,  # type: ignore[overload-overlap]
          optimizer: _Opt = ..., *, strategy: DataParallelName = ..., precision: str = ...,
          env: Env | None = ..., verbose: bool = ..., **options: object
          ) -> tuple[torch.nn.Module, _Opt]: ...
@overload
def setup(model: torch.nn.Module | None, optimizer: _Opt = ..., *, strategy: str,
          precision: str = ..., env: Env | None = ..., verbose: bool = ..., **options: object
          ) -> tuple[torch.nn.Module | PipelineModel, _Opt]: ...
def setup(model: Any, optimizer: Any = None, *, strategy: str = "ddp", precision: str = "fp32",
          env: Env | None = None, verbose: bool = False, **options: Any) -> tuple[Any, Any]:
    """Apply a parallel strategy and a precision to ``model`` and ``optimizer``.

    Args:
        model: a ``torch.nn.Module`` (on any device; it is moved to ``env.device``).
        optimizer: an optimizer over ``model.parameters()``, created before the first step,
            or None. Strategies that replace parameters rebuild it with the same class and
            param_groups hyper-parameters.
        strategy: ``none``, ``ddp``, ``zero1``, ``zero2``, ``zero3`` (alias ``fsdp``), ``hsdp``,
            ``offload``, ``pipeline`` or ``auto``.
        precision: ``fp32``, ``tf32``, ``bf16`` or ``fp16`` (see scaletrain.parallel.precision).
        env: the Env to use; default ``scaletrain.init()``.
        verbose: rank 0 prints what was applied.
        **options: ``bucket_cap_mb``, ``static_graph``, ``find_unused_parameters`` (DDP);
            ``min_params``, ``wrap`` (FSDP wrapping); ``mesh_shape`` (HSDP); anything else
            goes to the pipeline strategy and is an error for the others.

    Returns:
        ``(model, optimizer)`` to train with: call ``model(x)`` and ``optimizer.step()`` as
        before; use ``scaletrain.backward(loss)`` for fp16 and ``scaletrain.accumulate``.
        For type checkers: a ``torch.nn.Module`` (a ``PipelineModel`` for
        ``strategy="pipeline"``; either when the name is only known as a ``str``), and a
        ``torch.optim.Optimizer`` (None when none was given).

    Raises:
        StrategyError: the strategy/precision is unknown or cannot run here (the hint says
            what to use instead).
    """
    settings.check_value(ENV, env, "setup(): env")
    settings.check_value(VERBOSE, verbose, "setup(): verbose")
    spec = resolve_strategy(strategy)
    prec = resolve_precision(precision)
    opts = _split_options(spec, options)
    _check_inputs(model, optimizer, spec, opts)
    env = _current_env(env)
    messages: list[str] = []
    spec = _choose(spec, strategy, model, optimizer, env, prec, messages)
    dims = dims_for(spec, world_size=env.world_size, local_world_size=env.local_world_size,
                    num_nodes=env.num_nodes, mesh_shape=opts.mesh_shape,
                    pipeline_stages=_pipeline_stages(opts),
                    pipeline_sharded=opts.extra.get("data_parallel") == "fsdp")
    _check_device_sharing(spec, env)
    model, device_type = _place(model, spec, prec, env)
    ctx = Context(env=env, spec=spec, dims=dims, mesh=_mesh(spec, dims, device_type),
                  options=opts, precision=prec)
    engine = strategy_for(spec)
    model, optimizer = engine.apply(model, optimizer, ctx)

    state = ParallelState(strategy=spec, precision=prec, dims=dims, env=env, notes=messages,
                          sharding=engine.sharding(model, ctx),
                          scaler=make_scaler(prec, sharded=spec.engine == "fsdp",
                                             device_type=device_type))
    if state.scaler is not None and optimizer is not None:
        install_scaled_step(optimizer, state)
    attach_state(state, model, optimizer)
    if verbose:
        _print_main(env, f"scaletrain: strategy {spec.name} ({spec.summary}), precision "
                         f"{prec.name}, {_describe_dims(dims)}")
    return model, optimizer


def _choose(spec: StrategySpec, asked: str, model: Any, optimizer: Any, env: Env,
            prec: PrecisionSpec, messages: list[str]) -> StrategySpec:
    """The strategy that runs: ``auto``'s choice, then fitted to the world (notes to messages)."""
    if spec.engine == "auto":
        from scaletrain.parallel import auto

        choice = auto.choose(model, optimizer, env, prec.name)
        messages.append(choice.reason())
        _print_main(env, "scaletrain: " + choice.reason())
        spec = resolve_strategy(choice.strategy)
    spec, note = _fit_world(spec, env)
    if note:
        messages.append(note)
        if _asked(asked) not in ("ddp", "auto"):
            _print_main(env, "scaletrain: " + note)
    return spec


def _place(model: Any, spec: StrategySpec, prec: PrecisionSpec, env: Env) -> tuple[Any, str]:
    """Precision flags, the model on this rank's device (where the strategy does not place it)
    and autocast for the unsharded engines; returns the model and the device type."""
    import torch

    apply_flags(prec)
    if spec.engine not in ("fsdp", "pipeline"):
        model = model.to(torch.device(env.device))
    # else fully_shard moves each module to the mesh's device as it shards it, and the pipeline
    # moves only this rank's stage, so the whole model never has to fit on one GPU (and
    # offload keeps the shards on the host).
    device_type = torch.device(env.device).type
    if spec.engine in ("none", "ddp") and prec.compute_dtype:
        wrap_forward_autocast(model, prec, device_type)
    return model, device_type


def _mesh(spec: StrategySpec, dims: ParallelDims, device_type: str) -> DeviceMesh | None:
    """The one mesh; None without a process group (the strategy then says what it needs)."""
    if spec.engine != "none" and live_dist() is not None:
        return build_mesh(dims, device_type,
                          primary="shard" if spec.engine == "fsdp" else "replicate")
    return None


def strategy_for(spec: StrategySpec) -> Strategy:
    """The strategy object that implements ``spec.engine``.

    The strategies import :mod:`scaletrain.parallel.strategy` for their interface; choosing
    one here, not there, keeps that module free of an import circle. Each is imported on
    demand (the pipeline imports torch at import).
    """
    if spec.engine == "none":
        return NoneStrategy()
    if spec.engine == "ddp":
        from scaletrain.parallel import ddp, zero

        return zero.Zero1Strategy() if spec.shard_optimizer else ddp.DDPStrategy()
    if spec.engine == "fsdp":
        from scaletrain.parallel import fsdp

        return fsdp.FSDPStrategy()
    if spec.engine == "pipeline":
        from scaletrain.parallel import pipeline

        return pipeline.PipelineStrategy()
    raise StrategyError(f"strategy {spec.name!r} has no engine {spec.engine!r}",
                        hint="this is a bug in scaletrain; please report it")


def _check_inputs(model: Any, optimizer: Any, spec: StrategySpec,
                  opts: StrategyOptions) -> None:
    """A model (a Module, unless the pipeline gets ``stages=``) and an optimizer or None."""
    if model is None and not (spec.engine == "pipeline" and opts.extra.get("stages")):
        raise UsageError("scaletrain.setup() needs the model to train, got None",
                         "model, optimizer = scaletrain.setup(model, optimizer, strategy=...)")
    if model is not None and not callable(getattr(model, "named_parameters", None)):
        raise UsageError(f"scaletrain.setup() needs a torch.nn.Module as the model, got a "
                         f"{type(model).__name__}",
                         "model, optimizer = scaletrain.setup(model, optimizer, strategy=...)")
    if model is not None and any(getattr(t, "is_meta", False)
                                 for t in (*model.parameters(), *model.buffers())):
        raise UsageError("scaletrain.setup(): the model's parameters are on the meta device (shapes "
                         "without values), which no strategy can move or train",
                         "give them values first: model.to_empty(device='cpu'), then initialise "
                         "them (reset_parameters() or load_state_dict()), then call setup()")
    if optimizer is not None and not hasattr(optimizer, "param_groups"):
        raise UsageError(f"scaletrain.setup() needs a torch optimizer (or None) as the "
                         f"optimizer, got a {type(optimizer).__name__}",
                         "build it before setup(): optimizer = torch.optim.AdamW(model."
                         "parameters()); then scaletrain.setup(model, optimizer)")


def _split_options(spec: StrategySpec, options: dict[str, Any]) -> StrategyOptions:
    known = {k: options[k] for k in _OPTION_NAMES if k in options}
    extra = {k: v for k, v in options.items() if k not in _OPTION_NAMES}
    if extra and spec.engine not in ("pipeline",):
        raise StrategyError(f"unknown option(s) for strategy {spec.name!r}: {', '.join(sorted(extra))}",
                            hint=f"known options: {', '.join(_OPTION_NAMES)}")
    return StrategyOptions(**known, extra=extra)


def _asked(strategy: str) -> str:
    """The canonical name of what the caller asked for (before auto or world-size changes)."""
    return resolve_strategy(strategy).name


def _pipeline_stages(opts: StrategyOptions) -> int | None:
    points = opts.extra.get("split_points")
    if points is not None:
        return len([points] if isinstance(points, str) else points) + 1
    if opts.extra.get("stages") is not None:
        return len(opts.extra["stages"])
    return None


def _fit_world(spec: StrategySpec, env: Env) -> tuple[StrategySpec, str | None]:
    """Adapt a strategy to a world of one, and warn about ``none`` on several processes."""
    if env.world_size == 1 and spec.engine in ("ddp", "fsdp") and not spec.offload:
        return resolve_strategy("none"), (
            f"strategy {spec.name} on a world of 1 process: nothing to average or shard, "
            "running unwrapped")
    if env.world_size > 1 and spec.engine == "none":
        warnings.warn(f"strategy 'none' with {env.world_size} processes: each rank trains its own "
                      "copy and gradients are not averaged; use strategy='ddp' to train one model",
                      stacklevel=3)
    return spec, None


def _check_device_sharing(spec: StrategySpec, env: Env) -> None:
    """NCCL refuses two ranks on one GPU: say so before it hangs or fails deep inside."""
    if env.world_size == 1 or env.backend != "nccl" or spec.engine == "none":
        return
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < env.local_world_size:
        raise StrategyError(
            f"{env.local_world_size} ranks on this node share {visible} GPU(s), and NCCL "
            "refuses two ranks on one GPU",
            hint="run one rank per GPU, or `scaletrain run --procs-per-gpu K` (it uses gloo "
                 "for ranks that share a GPU)")


def _current_env(env: Env | None) -> Env:
    if env is not None:
        return env
    from scaletrain.runtime.init import init

    return init()


def _print_main(env: Env, text: str) -> None:
    if env.rank == 0:
        print(text, flush=True)


def _describe_dims(dims: ParallelDims) -> str:
    return (f"world {dims.world_size} = replicate {dims.replicate} x shard {dims.shard} x "
            f"pipeline {dims.pipeline}")
