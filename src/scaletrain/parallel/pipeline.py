"""Pipeline parallelism: the model cut into stages over ranks, micro-batches, GPipe or 1F1B.

Built on ``torch.distributed.pipelining`` (``PipelineStage`` + ``ScheduleGPipe`` /
``Schedule1F1B``), optionally with data parallelism across pipeline replicas (the seeds'
"model + data parallel"). ``scaletrain.setup(model, opt, strategy="pipeline", ...)`` calls
``apply`` below; it can also be called directly::

    pipe, opt = pipeline.apply(model, opt, env, split_points=["layer3"], n_microbatches=4,
                               schedule="1f1b", loss_fn=F.cross_entropy,
                               example_input=x)          # x only needed to trace non-Sequential
    for x, y in loader:                                  # every rank sees its replica's batch
        loss = pipe.step(x, y)                           # a tensor on the last stage, else None

Layout. ``S`` stages, ``W`` ranks, ``D = W / S`` pipeline replicas on the one DeviceMesh of
``scaletrain.parallel.strategy.build_mesh``: ``("replicate", "pipeline")`` of shape
``(D, S)`` (``("shard", "pipeline")`` with ``data_parallel="fsdp"``, ``("pipeline",)`` when
D = 1). Rank ``r`` runs stage ``r % S`` of replica ``r // S``, so one replica's stages are
neighbouring ranks (the same node, where activations travel fastest). Each rank holds only
its stage's parameters and optimizer state; the stage module is wrapped in DDP (or FSDP2)
over the replicas' group so its gradients are averaged across replicas. Precision: bf16
runs the stage under autocast (FSDP2's MixedPrecisionPolicy with ``data_parallel="fsdp"``);
fp16 is refused, because the schedule runs backward itself and the loss cannot be scaled. ``PipelineModel.stage_of`` says which stage
owns which parameter (by the model's own names) and ``full_state_dict()`` gathers them all.

Numerics. The schedule splits the batch into equal micro-batches, divides gradients by
their number, and DDP averages over replicas; with a mean-reduced loss this is the
gradient of the whole global batch, the same as one process (tests/multiproc prove it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from scaletrain import settings
from scaletrain.errors import DistEnvError, StrategyError
from scaletrain.parallel import ddp, fsdp, optim
from scaletrain.parallel.options import (
    STRATEGIES,
    ParallelDims,
    PrecisionSpec,
    StrategyOptions,
    StrategySettingError,
    dims_for,
    resolve_precision,
)
from scaletrain.parallel.pipeline_model import PipelineModel, batch_size, check_divisible
from scaletrain.parallel.pipeline_probe import choose_schedule
from scaletrain.parallel.pipeline_split import microbatch_of, split_model
from scaletrain.parallel.precision import wrap_forward_autocast
from scaletrain.parallel.strategy import Context, Layout, Sharding, build_mesh
from scaletrain.runtime.current import group_rank_world, live_dist
from scaletrain.torch_features import schedule_scales_grads

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from scaletrain.parallel.strategy import TrainModel
    from scaletrain.runtime.env import Env

__all__ = ["PipelineModel", "PipelineStrategy", "apply", "SCHEDULES"]

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b")
_DATA_PARALLEL: tuple[str, ...] = ("ddp", "fsdp")


# the pipeline's options (setup(strategy="pipeline", ...) or apply()), declared in the settings
# vocabulary: "pipeline: n_microbatches must be a whole number from 1 to 100,000, got 0"
OPTIONS: dict[str, settings.Spec] = {
    "n_microbatches": settings.Spec(doc="use at least the number of stages, e.g. n_microbatches=4",
                                    check=settings.count(), error=StrategySettingError),
}


def schedule_name(schedule_cls: type) -> str:
    """The name in ``SCHEDULES`` of a schedule class that ``_schedule_class`` returns."""
    return "1f1b" if schedule_cls.__name__ == "Schedule1F1B" else "gpipe"


def _schedule_class(name: str) -> type:
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    key = name.lower().replace("-", "").replace("_", "")
    table = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    if key not in table:
        raise StrategyError(f"unknown pipeline schedule {name!r}",
                            hint=f"use one of: {', '.join(SCHEDULES)}")
    return table[key]


class PipelineStrategy:
    """``pipeline``: stages over the mesh's ``pipeline`` dimension, replicas over the others."""

    def apply(self, model: nn.Module | None, optimizer: torch.optim.Optimizer | None,
              ctx: Context) -> tuple[PipelineModel, torch.optim.Optimizer | None]:
        return _build(model, optimizer, device=torch.device(ctx.env.device), mesh=ctx.mesh,
                      dims=ctx.dims, options=ctx.options, precision=ctx.precision,
                      **ctx.options.extra)

    def sharding(self, model: TrainModel, ctx: Context) -> Sharding:
        if not isinstance(model, PipelineModel):
            raise StrategyError("the pipeline strategy describes only the PipelineModel it built",
                                hint="this is a bug in scaletrain; please report it")
        within: Layout = "sharded" if ctx.dims.shard > 1 else "replicated"
        return Sharding(strategy=ctx.spec.name, params="staged", optimizer="staged",
                        within_stage=within, dims=ctx.dims, mesh=ctx.mesh,
                        stage=model.stage_index, n_stages=model.n_stages,
                        data_rank=model.dp_rank)



def apply(model: nn.Module | None, optimizer: torch.optim.Optimizer | None, env: Env | None = None,
          *, split_points: Sequence[str] | None = None,
          stages: Sequence[nn.Module] | None = None, n_microbatches: int = 4,
          schedule: str = "1f1b", loss_fn: Callable[..., torch.Tensor] | None = None,
          example_input: Any = None, data_parallel: str = "ddp",
          broadcast_loss: bool = False) -> tuple[PipelineModel, torch.optim.Optimizer | None]:
    """Cut ``model`` into stages over the ranks and return this rank's ``PipelineModel``.

    ``scaletrain.setup(model, opt, strategy="pipeline", ...)`` is the usual way in (it adds
    precision and the model's :func:`~scaletrain.parallel.describe`); this is the same
    strategy for code that manages its own process group, in fp32.

    Args:
        model: the whole model (its parameter names are kept); may be None with ``stages``.
        optimizer: built over the whole model; rebuilt (same class and group settings)
            over this stage's parameters and returned; create it before the first step.
        env: the ``scaletrain.Env`` (device); None means the CPU.
        split_points: module names; each starts a new stage (cut before it).
        stages: explicit stage modules instead, in order.
        n_microbatches: micro-batches per batch; the batch must divide evenly.
        schedule: ``"1f1b"`` (less activation memory) or ``"gpipe"``.
        loss_fn: ``loss_fn(output, target)``, mean-reduced, run on the last stage.
        example_input: one batch as given to ``step()``; needed to trace a model that is
            not an ``nn.Sequential`` (tracing fixes that batch's shapes).
        data_parallel: ``"ddp"`` or ``"fsdp"`` across pipeline replicas (W / stages > 1).
        broadcast_loss: make ``step()`` return the global mean loss on every rank.

    Raises:
        StrategyError: a bad option (the hint names the fix); DistEnvError: no process
        group, or a world size that the stages do not divide.
    """
    return _build(model, optimizer, device=torch.device(env.device if env is not None else "cpu"),
                  mesh=None, dims=None, options=StrategyOptions(),
                  precision=resolve_precision("fp32"), split_points=split_points,
                  stages=stages, n_microbatches=n_microbatches, schedule=schedule,
                  loss_fn=loss_fn, example_input=example_input, data_parallel=data_parallel,
                  broadcast_loss=broadcast_loss)


def _build(model: nn.Module | None, optimizer: torch.optim.Optimizer | None, *,
           device: torch.device, mesh: DeviceMesh | None, dims: ParallelDims | None,
           options: StrategyOptions, precision: PrecisionSpec,
           split_points: Sequence[str] | None = None,
           stages: Sequence[nn.Module] | None = None, n_microbatches: int = 4,
           schedule: str = "1f1b", loss_fn: Callable[..., torch.Tensor] | None = None,
           example_input: Any = None, data_parallel: str = "ddp",
           broadcast_loss: bool = False) -> tuple[PipelineModel, torch.optim.Optimizer | None]:
    """The pipeline strategy; ``mesh``/``dims`` come from ``setup()`` or are built here."""
    schedule_cls = _check_request(precision, loss_fn, n_microbatches, data_parallel, schedule,
                                  split_points, stages)
    # over gloo some releases hang or abort in a schedule: probed, then kept, GPipe, or refused
    chosen = choose_schedule(schedule_name(schedule_cls), dist.get_backend())
    schedule_cls = _schedule_class(chosen)
    rank, world = group_rank_world()
    split = split_model(model, split_points=split_points, stages=stages,
                        example_microbatch=_example_microbatch(model, example_input,
                                                               n_microbatches))
    n_stages = split.n_stages
    stage_index, dp_rank = rank % n_stages, rank // n_stages
    if dims is None or mesh is None or dims.pipeline != n_stages:  # called directly
        dims = dims_for(STRATEGIES["pipeline"], world_size=world, local_world_size=world,
                        num_nodes=1, pipeline_stages=n_stages,
                        pipeline_sharded=data_parallel == "fsdp")
        mesh = build_mesh(dims, device.type, primary="pipeline")

    # the user's optimizer holds the model's parameters, shared with the stage modules until
    # .to(device)/FSDP replace them: name every stage's parameters to map old onto new
    names = {id(p): f"{i}.{n}" for i, m in enumerate(split.modules)
             for n, p in m.named_parameters(remove_duplicate=False)}
    groups = optim.hyper_groups(optimizer, names) if optimizer is not None else []
    module = split.modules[stage_index].to(device)
    wrapped = _wrap_stage(module, dims, mesh, device, options, precision)
    new_optimizer = None
    if optimizer is not None:
        here = {f"{stage_index}.{n}": p
                for n, p in module.named_parameters(remove_duplicate=False)}
        new_optimizer = optim.rebuild(optimizer, groups, here)

    from torch.distributed.pipelining import PipelineStage

    stage = PipelineStage(wrapped, stage_index, n_stages, device,
                          group=mesh.get_group("pipeline"))
    # torch 2.6's schedules take no scale_grads and sum the micro-batches' gradients: then
    # PipelineModel.step divides them itself (the same division torch's stage makes)
    scales = schedule_scales_grads(schedule_cls)
    sched = schedule_cls(stage, n_microbatches=n_microbatches, loss_fn=loss_fn,
                         **({"scale_grads": True} if scales else {}))
    pipe = PipelineModel(split=split, stage_index=stage_index, dp_size=dims.data_parallel,
                         dp_rank=dp_rank, module=module, wrapped=wrapped, stage=stage,
                         schedule=sched, optimizer=new_optimizer,
                         n_microbatches=n_microbatches, mesh=mesh,
                         broadcast_loss=broadcast_loss, divide_grads=not scales,
                         traced_batch=batch_size(example_input)
                         if split.method == "traced" else None)
    return pipe, new_optimizer


def _check_request(precision: PrecisionSpec, loss_fn: Callable[..., torch.Tensor] | None,
                   n_microbatches: int, data_parallel: str, schedule: str,
                   split_points: Sequence[str] | None,
                   stages: Sequence[nn.Module] | None) -> type:
    """StrategyError/DistEnvError for a pipeline that cannot run; else the schedule's class."""
    settings.check_value(OPTIONS["n_microbatches"], n_microbatches, "pipeline: n_microbatches")
    if live_dist() is None:
        raise DistEnvError("pipeline parallelism needs the process group",
                           hint="call scaletrain.init() first and start with "
                                "'scaletrain run --nproc-per-node N script.py'")
    if precision.scaler:
        raise StrategyError(
            f"precision {precision.name!r} needs loss scaling, but the pipeline schedule runs "
            "backward itself, so the loss cannot be scaled",
            hint="use precision='bf16' with the pipeline: the same memory saving, no scaling")
    if loss_fn is None:
        raise StrategyError("pipeline training needs loss_fn=: the last stage computes the loss",
                            hint="pass loss_fn=torch.nn.functional.cross_entropy (mean-reduced)")
    if data_parallel not in _DATA_PARALLEL:
        raise StrategyError(f"unknown data_parallel {data_parallel!r} for the pipeline",
                            hint=f"use one of: {', '.join(_DATA_PARALLEL)}")
    schedule_cls = _schedule_class(schedule)
    world = group_rank_world()[1]
    n_stages = stage_count(split_points, stages)
    if n_stages >= 2 and world % n_stages:
        raise DistEnvError(
            f"{world} ranks cannot be divided into pipelines of {n_stages} stages",
            hint=f"start a multiple of {n_stages} processes (e.g. --nproc-per-node "
                 f"{n_stages * max(1, world // n_stages)}), or use {world} stages")
    if schedule_cls.__name__ == "Schedule1F1B" and n_microbatches < n_stages:
        raise StrategyError(f"1F1B needs at least as many micro-batches as stages "
                            f"({n_microbatches} < {n_stages})",
                            hint=f"use n_microbatches={n_stages} or more, or schedule='gpipe'")
    return schedule_cls


def _example_microbatch(model: nn.Module | None, example_input: Any,
                        n_microbatches: int) -> tuple[Any, ...] | None:
    """One micro-batch of ``example_input`` on the model's device, for tracing; None without."""
    if example_input is None:
        return None
    check_divisible(example_input, n_microbatches, "example_input")
    first = next(iter(model.parameters()), None) if model is not None else None
    return tuple(a.to(first.device) if first is not None and isinstance(a, torch.Tensor) else a
                 for a in microbatch_of(example_input, n_microbatches))


def _wrap_stage(module: nn.Module, dims: ParallelDims, mesh: DeviceMesh, device: torch.device,
                options: StrategyOptions, precision: PrecisionSpec) -> nn.Module:
    """This rank's stage wrapped for data parallelism across the pipeline replicas."""
    dp_dim = "shard" if dims.shard > 1 else "replicate"
    if dims.shard > 1:
        # ZeRO-2 style: parameters stay gathered across the micro-batches of one step
        # (re-gathering them for every micro-batch would multiply the traffic); the
        # precision's MixedPrecisionPolicy casts the compute
        return fsdp.shard(module, mesh[dp_dim], spec=STRATEGIES["zero2"], options=options,
                          precision=precision)
    wrap_forward_autocast(module, precision, device.type)
    if dims.data_parallel > 1:
        # find_unused_parameters=True: the stage runs its micro-batches' forwards under
        # no_sync and prepares DDP's reducer itself before the last backward. Without the
        # flag, DDP's bucket rebuild at the second step fails an internal check (torch
        # 2.13: "rebuilt parameter indices size is not same as original model parameters
        # size", 8 vs 4); with it DDP skips that rebuild, at the cost of one graph walk.
        return ddp.wrap(module, str(device), replace(options, find_unused_parameters=True),
                        process_group=mesh.get_group(dp_dim))
    return module


def stage_count(split_points: Sequence[str] | str | None,
                stages: Sequence[nn.Module] | None) -> int:
    """How many stages ``split_points`` (a name or names) or ``stages`` make."""
    if split_points is not None:
        return len([split_points] if isinstance(split_points, str) else split_points) + 1
    return len(stages or ())
