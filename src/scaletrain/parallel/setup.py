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
5. compute precision: autocast around ``forward`` (none/ddp/zero1), or FSDP2's
   MixedPrecisionPolicy passed to step 6 (zero2/zero3/hsdp/offload);
6. the strategy wraps the model (DDP, ``fully_shard`` bottom-up, pipeline stages);
7. the optimizer is rebuilt over the new parameters when they changed (ZeRO-1, FSDP2);
8. loss scaling for fp16: a scaler, and ``optimizer.step()`` that unscales/steps/updates.

On a world of one process the data-parallel strategies (ddp, zero1, zero2, zero3, hsdp) have
nothing to average or shard: the model runs unwrapped - identical numbers, no overhead - and a
note says so. ``offload`` still applies (it moves state to host memory on one GPU too).
``none`` on several processes is allowed with a warning: each rank then trains its own copy.
"""

from __future__ import annotations

import warnings
from typing import Any

from scaletrain.errors import StrategyError, UsageError
from scaletrain.parallel.options import (
    ParallelDims,
    StrategyOptions,
    StrategySpec,
    dims_for,
    resolve_strategy,
)
from scaletrain.parallel.precision import (
    ParallelState,
    apply_flags,
    attach_state,
    install_scaled_step,
    make_scaler,
    resolve_precision,
    wrap_forward_autocast,
)

_OPTION_NAMES = ("bucket_cap_mb", "static_graph", "find_unused_parameters", "min_params", "wrap",
                 "mesh_shape")


def setup(model: Any, optimizer: Any = None, *, strategy: str = "ddp", precision: str = "fp32",
          env: Any = None, verbose: bool = False, **options: Any) -> tuple[Any, Any]:
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

    Raises:
        StrategyError: the strategy/precision is unknown or cannot run here (the hint says
            what to use instead).
    """
    spec = resolve_strategy(strategy)
    prec = resolve_precision(precision)
    opts = _split_options(spec, options)
    _check_inputs(model, optimizer, spec, opts)
    env = _current_env(env)
    messages: list[str] = []

    if spec.engine == "auto":
        from scaletrain.parallel import auto

        choice = auto.choose(model, optimizer, env, prec.name)
        messages.append(choice.reason())
        _print_main(env, "scaletrain: " + choice.reason())
        spec = resolve_strategy(choice.strategy)
    spec, note = _fit_world(spec, env)
    if note:
        messages.append(note)
        if _asked(strategy) not in ("ddp", "auto"):
            _print_main(env, "scaletrain: " + note)
    dims = dims_for(spec, world_size=env.world_size, local_world_size=env.local_world_size,
                    num_nodes=env.num_nodes, mesh_shape=opts.mesh_shape,
                    pipeline_stages=_pipeline_stages(opts))
    if spec.engine == "pipeline" and prec.compute_dtype:
        raise StrategyError(f"precision {prec.name!r} is not wired into the pipeline strategy yet",
                            hint="use precision='fp32' or 'tf32' with pipeline, or a "
                                 "data-parallel strategy for bf16/fp16")
    _check_device_sharing(spec, env)

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

    model, optimizer = _apply_strategy(model, optimizer, env, spec, dims, opts, prec)

    state = ParallelState(strategy=spec, precision=prec, dims=dims, env=env, notes=messages,
                          scaler=make_scaler(prec, sharded=spec.engine == "fsdp",
                                             device_type=device_type))
    if state.scaler is not None and optimizer is not None:
        install_scaled_step(optimizer, state)
    attach_state(state, model, optimizer)
    if verbose:
        _print_main(env, f"scaletrain: strategy {spec.name} ({spec.summary}), precision "
                         f"{prec.name}, {_describe_dims(dims)}")
    return model, optimizer


def _apply_strategy(model: Any, optimizer: Any, env: Any, spec: StrategySpec, dims: ParallelDims,
                    opts: StrategyOptions, prec: Any) -> tuple[Any, Any]:
    """Step 6-7: hand the model to the module that implements ``spec.engine``."""
    if spec.engine == "none":
        return model, optimizer
    if spec.engine == "ddp":
        if spec.shard_optimizer:
            from scaletrain.parallel import zero

            if optimizer is None:
                raise StrategyError("zero1 shards the optimizer, but no optimizer was given",
                                    hint="setup(model, optimizer, strategy='zero1'), or use ddp")
            return zero.apply(model, optimizer, env, opts)
        from scaletrain.parallel import ddp

        return ddp.apply(model, env, opts), optimizer
    if spec.engine == "fsdp":
        from scaletrain.parallel import fsdp

        return fsdp.apply(model, optimizer, env, spec, dims, opts, prec)
    if spec.engine == "pipeline":
        from scaletrain.parallel import pipeline

        result = pipeline.apply(model, optimizer, env, **opts.extra)
        return result if isinstance(result, tuple) else (result, optimizer)
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
    if opts.extra.get("stages") is not None:
        return len(opts.extra["stages"])
    if opts.extra.get("split_points") is not None:
        return len(opts.extra["split_points"]) + 1
    return None


def _fit_world(spec: StrategySpec, env: Any) -> tuple[StrategySpec, str | None]:
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


def _check_device_sharing(spec: StrategySpec, env: Any) -> None:
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


def _current_env(env: Any) -> Any:
    if env is not None:
        return env
    from scaletrain.runtime.init import init

    return init()


def _print_main(env: Any, text: str) -> None:
    if env.rank == 0:
        print(text, flush=True)


def _describe_dims(dims: ParallelDims) -> str:
    return (f"world {dims.world_size} = replicate {dims.replicate} x shard {dims.shard} x "
            f"pipeline {dims.pipeline}")
