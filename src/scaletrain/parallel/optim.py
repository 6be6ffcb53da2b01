"""Rebuild the user's optimizer over new parameters, keeping its class and hyper-parameters.

Sharding strategies replace a model's parameters (FSDP2 swaps them for DTensor shards), so an
optimizer created before ``setup()`` points at tensors the model no longer uses. We map each
old parameter to its new one by name and build the same optimizer class with the same
param_groups (lr, momentum, weight decay... per group).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from scaletrain.errors import StrategyError


def param_names(model: Any) -> dict[int, str]:
    """``id(parameter) -> qualified name`` (taken before the model is transformed)."""
    return {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}


def hyper_groups(optimizer: Any, names: dict[int, str]) -> list[dict[str, Any]]:
    """The optimizer's param_groups with parameters replaced by their names."""
    groups = []
    for group in optimizer.param_groups:
        missing = [p for p in group["params"] if id(p) not in names]
        if missing:
            raise StrategyError(
                f"the optimizer holds {len(missing)} tensor(s) that are not parameters of the model",
                hint="build the optimizer from model.parameters() of the model given to setup()")
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": [names[id(p)] for p in group["params"]]})
    return groups


def rebuild(optimizer: Any, groups: list[dict[str, Any]], new_params: dict[str, Any],
            factory: Callable[..., Any] | None = None) -> Any:
    """A new optimizer of ``type(optimizer)`` over ``new_params`` (name -> parameter).

    ``factory(param_groups, **defaults)`` builds it (default: the optimizer's own class); the
    ZeRO-1 strategy passes ZeroRedundancyOptimizer there.
    """
    if optimizer.state:
        warnings.warn("scaletrain.setup(): the optimizer already has state (it has stepped); "
                      "that state is dropped when the optimizer is rebuilt over sharded "
                      "parameters. Create the optimizer, then call setup() before training.",
                      stacklevel=3)
    param_groups = []
    for group in groups:
        params = [new_params[name] for name in group["params"] if name in new_params]
        param_groups.append({**group, "params": params})
    cls = type(optimizer)
    build = factory or cls
    try:
        return build(param_groups, **optimizer.defaults)
    except TypeError:
        # Some optimizers keep defaults that their constructor does not take; every group
        # already carries its hyper-parameters, so the groups alone are enough.
        return build(param_groups)
