"""What a checkpoint holds: the state objects sorted by how they are stored, and RNG states.

``classify(state)`` turns the user's mapping into :class:`Entry` records:

- ``value``: a plain value (int, float, str, bool, None, a tensor, lists/tuples/dicts of them),
  written once (rank 0's) and put back into the mapping on load;
- ``model``: an ``nn.Module`` (plain, DDP, FSDP2) - state through torch's state-dict helpers
  (``get_model_state_dict``), keyed by the model's own parameter names;
- ``optimizer``: an optimizer over a model's parameters (found in the same mapping), also
  through the helpers, keyed by parameter names; ZeroRedundancyOptimizer and a pipeline
  stage's optimizer keep only this rank's parameters' state (``named`` entries);
- ``pipeline``: a ``scaletrain`` PipelineModel (this rank's stage);
- ``object``: anything else with ``state_dict``/``load_state_dict`` (LR scheduler, GradScaler,
  a training loader, your own objects): rank 0's state_dict is written;
- ``local``: an object whose state differs per rank (an evaluation loader, a model that
  ``setup(strategy="none")`` left as each rank's own copy): every rank's.

Whether an entry's tensors are sharded over ranks is decided in ONE function,
:func:`is_sharded` (from ``setup()``'s Strategy report and the objects); the rest of the
package only reads ``Entry.sharded``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scaletrain.errors import UsageError

_PLAIN = (int, float, str, bool, type(None), bytes)


@dataclass(kw_only=True)
class Entry:
    """One named object of the state, and how it is stored."""

    name: str
    obj: Any
    kind: str  # value | model | optimizer | pipeline | object | local
    sharded: bool = False  # written with torch.distributed.checkpoint, a shard per rank
    model: Any = None  # optimizer: the model (or pipeline) whose parameters it updates
    named: bool = False  # optimizer state keyed by parameter name, this rank's parameters only


def _is_tensor(obj: Any) -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def is_plain(obj: Any, _depth: int = 0) -> bool:
    """True for values torch.load(weights_only=True) reads back: numbers, strings, tensors,
    and lists/tuples/dicts of them (dict keys plain)."""
    if _depth > 64:
        return False
    if isinstance(obj, _PLAIN) or _is_tensor(obj):
        return True
    if isinstance(obj, (list, tuple)):
        return all(is_plain(v, _depth + 1) for v in obj)
    if isinstance(obj, dict):
        return all(isinstance(k, _PLAIN) and is_plain(v, _depth + 1) for k, v in obj.items())
    return False


def is_pipeline(obj: Any) -> bool:
    """A scaletrain PipelineModel (one rank's stage)."""
    return type(obj).__name__ == "PipelineModel" and hasattr(obj, "stage_of")


def is_zero(obj: Any) -> bool:
    """A ZeroRedundancyOptimizer (zero1)."""
    return type(obj).__name__ == "ZeroRedundancyOptimizer" and hasattr(obj, "optim")


def _params_of(obj: Any) -> list[Any]:
    if hasattr(obj, "param_groups"):
        return [p for g in obj.param_groups for p in g["params"]]
    if is_pipeline(obj):
        return obj.parameters()
    return list(obj.parameters())


# Layouts of scaletrain.parallel.Sharding whose state differs between ranks
_SPLIT_LAYOUTS = ("sharded", "partitioned", "staged")


def reported_layout(obj: Any) -> str | None:
    """The layout ``setup()`` reports for ``obj`` through the Strategy interface
    (``scaletrain.parallel.describe``), or None (not set up by ``setup()``)."""
    if obj is None:
        return None
    from scaletrain.parallel import describe

    sharding = describe(obj)
    return str(sharding.layout_of(obj)) if sharding is not None else None


def is_sharded(obj: Any, model: Any = None) -> bool:
    """Whether ``obj``'s state is split over ranks (so written with DCP, a shard per rank).

    The one place that decides. ``setup()``'s report (``scaletrain.parallel.describe``:
    ``sharded`` FSDP2, ``partitioned`` ZeRO-1, ``staged`` pipeline) is asked first; the
    objects themselves are checked too, so an object set up by hand counts as well: a
    pipeline stage and its optimizer, a ZeroRedundancyOptimizer, and any model or optimizer
    holding DTensor parameters (zero2, zero3, hsdp, offload). A strategy on a world of one
    runs unwrapped and is replicated.
    """
    if reported_layout(obj) in _SPLIT_LAYOUTS:
        return True
    if is_pipeline(obj) or (model is not None and is_pipeline(model)) or is_zero(obj):
        return True
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return any(isinstance(p, DTensor) for p in _params_of(obj))


def strategy_name(entries: list[Entry]) -> str | None:
    """The strategy ``setup()`` applied to the first model of the state, if any."""
    from scaletrain.parallel.precision import state_of

    for entry in entries:
        if entry.kind in ("model", "pipeline", "optimizer"):
            ps = state_of(entry.obj)
            if ps is not None:
                return str(ps.strategy.name)
    return None


def classify(state: Mapping[str, Any]) -> list[Entry]:
    """Sort ``state``'s objects into entries; UsageError for what cannot be checkpointed."""
    import torch

    if not isinstance(state, Mapping):
        raise UsageError(f"checkpoint state must be a dict of name -> object, got "
                         f"{type(state).__name__}",
                         hint="e.g. ckpt.save(step, {'model': model, 'optimizer': opt})")
    entries: list[Entry] = []
    models: list[Any] = []
    for name, obj in state.items():
        if not isinstance(name, str) or not name or "/" in name or name.startswith("_"):
            raise UsageError(f"checkpoint state name {name!r} is not usable",
                             hint="use non-empty string names without '/' that do not start "
                                  "with '_', e.g. 'model', 'optimizer'")
        if reported_layout(obj) == "per_rank":
            # strategy 'none' on several processes: every rank trains its own copy
            entries.append(Entry(name=name, obj=obj, kind="local"))
        elif is_pipeline(obj):
            entries.append(Entry(name=name, obj=obj, kind="pipeline", sharded=True))
            models.append(obj)
        elif isinstance(obj, torch.nn.Module):
            entries.append(Entry(name=name, obj=obj, kind="model", sharded=is_sharded(obj)))
            models.append(obj)
        elif isinstance(obj, torch.optim.Optimizer):
            entries.append(Entry(name=name, obj=obj, kind="optimizer"))
        elif hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
            per_rank = getattr(obj, "mode", None) == "eval" and hasattr(obj, "sampler")
            entries.append(Entry(name=name, obj=obj, kind="local" if per_rank else "object"))
        elif is_plain(obj):
            entries.append(Entry(name=name, obj=obj, kind="value"))
        else:
            raise UsageError(
                f"state[{name!r}] is a {type(obj).__name__}: neither a plain value nor an "
                "object with state_dict()/load_state_dict()",
                hint="give it state_dict()/load_state_dict() methods, or checkpoint plain "
                     "numbers/strings/tensors (lists and dicts of them) instead")
    for entry in entries:
        if entry.kind == "optimizer":
            entry.model = _owner(entry, models)
            entry.sharded = is_sharded(entry.obj, entry.model)
            entry.named = entry.sharded and (is_zero(entry.obj) or is_pipeline(entry.model))
            if entry.model is None and entry.sharded:
                raise UsageError(f"state[{entry.name!r}] is a sharded optimizer, but the state "
                                 "holds no model with its parameters",
                                 hint="save the model in the same state, e.g. "
                                      "{'model': model, 'optimizer': opt}")
    return entries


def _owner(entry: Entry, models: list[Any]) -> Any:
    """The model in the state whose parameters ``entry``'s optimizer updates."""
    ids = {id(p) for p in _params_of(entry.obj)}
    for model in models:
        if ids and ids <= {id(p) for p in _params_of(model)}:
            return model
    return None


# -- RNG states -------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """This process's RNG states (Python, NumPy, torch CPU, CUDA) as tensors and plain values,
    so they load with ``weights_only=True``."""
    import torch

    version, internal, gauss = random.getstate()
    out: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64),
                   "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        out["numpy"] = {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys).astype("int64")),
                        "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)}
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(saved: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    import torch

    py = saved["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    torch.set_rng_state(saved["torch"].cpu())
    if "numpy" in saved:
        try:
            import numpy as np

            n = saved["numpy"]
            np.random.set_state((n["kind"], n["keys"].numpy().astype("uint32"), n["pos"],
                                 n["has_gauss"], n["cached"]))
        except ImportError:
            pass
    if "cuda" in saved and torch.cuda.is_available():
        states = [s.cpu() for s in saved["cuda"]]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
