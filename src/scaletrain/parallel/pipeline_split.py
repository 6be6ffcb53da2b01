"""Cut a model into pipeline stages: by module names, or from the user's own stage modules.

Three ways in, one result (``StageSplit``: one module per stage plus, for each stage, the
original fully-qualified names of the parameters it owns):

- ``nn.Sequential`` and split points that name its top-level children: sliced, no tracing.
- any other model with ``split_points``: traced with ``torch.distributed.pipelining.pipeline``
  (``torch.export`` underneath), cut *before* each named module. Tracing fixes the shapes
  of one micro-batch, so it needs an example batch.
- ``stages=[module, ...]``: the user's modules, used as they are (the manual
  ``PipelineStage`` path); each must run on the output of the one before.

Stage modules share their ``nn.Parameter`` objects with the model they came from, which is
how the optimizer's parameter groups and the parameter names are carried over.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from scaletrain.errors import StrategyError

__all__ = ["StageSplit", "microbatch_of", "split_model"]


@dataclass(frozen=True, kw_only=True)
class StageSplit:
    """A model cut into stages.

    Attributes:
        modules: one module per stage, in pipeline order.
        param_names: for each stage, stage-local parameter name -> the model's name for it.
        method: ``"sequential"``, ``"traced"`` or ``"explicit"``.
    """

    modules: tuple[nn.Module, ...]
    param_names: tuple[dict[str, str], ...]
    method: str

    @property
    def n_stages(self) -> int:
        """Number of stages."""
        return len(self.modules)

    def owner_of(self) -> dict[str, int]:
        """The model's parameter name -> index of the stage that owns it."""
        return {fqn: i for i, names in enumerate(self.param_names) for fqn in names.values()}


def _names_by_identity(model: nn.Module | None) -> dict[int, str]:
    if model is None:
        return {}
    return {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}


def _stage_param_names(modules: Sequence[nn.Module], model: nn.Module | None) -> tuple[
        dict[str, str], ...]:
    by_id = _names_by_identity(model)
    out: list[dict[str, str]] = []
    seen: dict[int, int] = {}
    for i, mod in enumerate(modules):
        names: dict[str, str] = {}
        for local, p in mod.named_parameters():
            if id(p) in seen and seen[id(p)] != i:
                raise StrategyError(
                    f"parameter {by_id.get(id(p), local)!r} is used by stages {seen[id(p)]} "
                    f"and {i}",
                    hint="tied weights must live in one stage: move the modules that share "
                         "them into the same stage")
            seen[id(p)] = i
            names[local] = by_id.get(id(p), f"stages.{i}.{local}")
        out.append(names)
    return tuple(out)


def _check_split_points(model: nn.Module, split_points: Sequence[str]) -> None:
    if not split_points:
        raise StrategyError("pipeline needs at least one split point",
                            hint="split_points=['layer3'] cuts the model before module "
                                 "'layer3' into 2 stages")
    if len(set(split_points)) != len(split_points):
        raise StrategyError(f"split points repeat a name: {list(split_points)}",
                            hint="name each module once")
    known = dict(model.named_modules())
    for name in split_points:
        if name not in known or name == "":
            children = [n for n, _ in model.named_children()]
            shown = ", ".join(children[:12]) + (", ..." if len(children) > 12 else "")
            raise StrategyError(
                f"unknown split point {name!r}: the model has no module of that name",
                hint=f"use module names from model.named_modules(); top-level: {shown}")


def _split_sequential(model: nn.Sequential, split_points: Sequence[str]) -> StageSplit | None:
    children = [n for n, _ in model.named_children()]
    if not all(p in children for p in split_points):
        return None  # a nested name: trace instead
    cuts = [children.index(p) for p in split_points]
    if cuts != sorted(cuts) or cuts[0] == 0:
        raise StrategyError(
            f"split points {list(split_points)} are not in forward order after the first "
            "module",
            hint=f"each split point starts a new stage; the order is {children}")
    bounds = [0, *cuts, len(children)]
    mods = tuple(nn.Sequential(*[model[j] for j in range(a, b)])
                 for a, b in zip(bounds[:-1], bounds[1:]))
    return StageSplit(modules=mods, param_names=_stage_param_names(mods, model),
                      method="sequential")


def _split_traced(model: nn.Module, split_points: Sequence[str],
                  example_args: tuple[Any, ...]) -> StageSplit:
    from torch.distributed.pipelining import SplitPoint, pipeline

    spec = {name: SplitPoint.BEGINNING for name in split_points}
    try:
        with warnings.catch_warnings():
            # torch's own pytree deprecation notices, raised inside export: not the user's
            warnings.simplefilter("ignore", FutureWarning)
            pipe = pipeline(model, mb_args=example_args, split_spec=spec)
    except Exception as exc:  # export failures come in many types
        raise StrategyError(
            f"could not trace the model to split it at {list(split_points)}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            hint="pass the stage modules yourself: stages=[nn.Sequential(...), ...]") from exc
    finally:
        # pipeline() patches forward() of the split modules; give the user's model back intact
        for name in split_points:
            mod = model.get_submodule(name)
            if "_orig_forward" in vars(mod):
                del mod.forward
                del mod._orig_forward
    if pipe.num_stages != len(split_points) + 1:
        raise StrategyError(
            f"tracing found {pipe.num_stages} stages, expected {len(split_points) + 1}",
            hint="a split point module is not called in forward(), or is called before an "
                 "earlier one; name modules in the order forward() runs them")
    if pipe.replicated_params:
        raise StrategyError(
            "some parameters are used in more than one stage (tied weights)",
            hint="choose split points that keep modules sharing weights in one stage")
    mods = tuple(pipe.get_stage_module(i) for i in range(pipe.num_stages))
    return StageSplit(modules=mods, param_names=_stage_param_names(mods, model),
                      method="traced")


def split_model(model: nn.Module | None, *, split_points: Sequence[str] | None = None,
                stages: Sequence[nn.Module] | None = None,
                example_microbatch: tuple[Any, ...] | None = None) -> StageSplit:
    """Cut ``model`` into stages (see the module docstring for the three ways).

    Raises:
        StrategyError: both or neither of ``split_points``/``stages``, an unknown or
            misordered split point, a model that cannot be traced, tied weights across
            stages, or tracing without an example batch.
    """
    if (split_points is None) == (stages is None):
        raise StrategyError("pipeline needs exactly one of split_points=... or stages=...",
                            hint="split_points=['layer3'] (module names) or "
                                 "stages=[nn.Sequential(...), nn.Sequential(...)]")
    if stages is not None:
        mods = tuple(stages)
        if len(mods) < 2 or not all(isinstance(m, nn.Module) for m in mods):
            raise StrategyError("stages= must be a list of at least 2 nn.Module objects",
                                hint="stages=[nn.Sequential(conv, pool), nn.Sequential(fc)]")
        return StageSplit(modules=mods, param_names=_stage_param_names(mods, model),
                          method="explicit")
    if model is None:
        raise StrategyError("split_points= needs the model to split",
                            hint="pass the model, or stages=[...] with the stage modules")
    points = [split_points] if isinstance(split_points, str) else list(split_points or ())
    _check_split_points(model, points)
    if isinstance(model, nn.Sequential):
        split = _split_sequential(model, points)
        if split is not None:
            return split
    if example_microbatch is None:
        raise StrategyError(
            f"splitting a {type(model).__name__} at {points} traces it, which needs an "
            "example batch",
            hint="pass example_input=<one batch as given to step()>, or build the model as "
                 "nn.Sequential, or pass stages=[...]")
    return _split_traced(model, points, example_microbatch)


def microbatch_of(batch: Any, n_microbatches: int) -> tuple[Any, ...]:
    """The first of ``n_microbatches`` chunks of a batch (tensor or tuple), as an args tuple."""
    args = batch if isinstance(batch, tuple) else (batch,)
    return tuple(a.tensor_split(n_microbatches)[0] if isinstance(a, torch.Tensor) else a
                 for a in args)
