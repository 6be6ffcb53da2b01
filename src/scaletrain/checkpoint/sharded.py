"""Sharded state through ``torch.distributed.checkpoint`` (DCP): each rank writes its own shard.

- FSDP2 models and optimizers (zero2, zero3, hsdp, offload): ``get_model_state_dict`` /
  ``get_optimizer_state_dict`` give DTensor shards keyed by parameter name; DCP writes each
  rank's shard and, on load, reads what each rank of the *new* world needs - so a checkpoint
  written by W ranks loads on any number of ranks (resharding), with no full gather.
- ZeroRedundancyOptimizer (zero1) and a pipeline stage's optimizer: each rank holds the state
  of whole parameters (its partition, its stage). We write ``{name}.state.{param}.{key}`` for
  this rank's parameters only; on load each rank reads the keys of the parameters it owns now,
  found in the checkpoint's metadata. No ``consolidate_state_dict()`` (that gathers every
  rank's state on one rank, the memory peak DCP avoids), and zero1 reshards too.
- A pipeline stage's parameters are written under the model's own names.

Loading goes through :mod:`scaletrain.checkpoint.safeio` (no pickle executed).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scaletrain.checkpoint.collect import Entry, is_zero
from scaletrain.checkpoint.marker import SHARDED
from scaletrain.checkpoint.safeio import read_dcp_metadata, safe_planner, safe_reader
from scaletrain.runtime.current import live_dist
from scaletrain.torch_features import dcp_parameters

SUBDIR = SHARDED   # the folder of DCP's files in a step folder (the marker module's name)


def _param_names(entry: Entry) -> dict[int, str]:
    """``id(param) -> name`` for the parameters of the optimizer's model (no DDP prefix)."""
    model = entry.model
    if hasattr(model, "stage_of"):  # PipelineModel: the whole model's names
        return {id(p): n for n, p in model.named_parameters()}
    inner = getattr(model, "module", model)
    return {id(p): n for n, p in inner.named_parameters(remove_duplicate=False)}


def _local_optimizer(entry: Entry) -> Any:
    """The optimizer that holds this rank's per-parameter state."""
    return entry.obj.optim if is_zero(entry.obj) else entry.obj


def named_groups(entry: Entry) -> list[dict[str, Any]]:
    """The optimizer's param_groups with parameter names instead of tensors (all ranks alike)."""
    names = _param_names(entry)
    return [{**{k: v for k, v in g.items() if k != "params"},
             "params": [names[id(p)] for p in g["params"]]} for g in entry.obj.param_groups]


def _named_state(entry: Entry) -> dict[str, Any]:
    names = _param_names(entry)
    local = _local_optimizer(entry)
    return {names[id(p)]: dict(s) for p, s in local.state.items() if s}


def collect(entries: list[Entry]) -> dict[str, Any]:
    """The DCP state dict of every sharded entry, keyed by entry name."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, \
        get_optimizer_state_dict

    out: dict[str, Any] = {}
    for e in entries:
        if not e.sharded:
            continue
        if e.kind == "pipeline":
            out[e.name] = {n: p.detach() for n, p in e.obj.named_parameters()}
        elif e.kind == "model":
            out[e.name] = get_model_state_dict(e.obj)
        elif e.kind == "optimizer" and e.named:
            out[e.name] = {"state": _named_state(e)}
        elif e.kind == "optimizer":
            out[e.name] = get_optimizer_state_dict(e.model, e.obj)
    return out


@contextmanager
def _dcp_call(name: str, kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The arguments this torch's ``dcp.<name>`` takes, of ``kwargs`` plus ``no_dist``.

    Where ``no_dist`` is no argument (torch 2.6), DCP infers it from the same fact - whether a
    process group is up. Either way DCP warns that a save without a group is "assumed" to be
    one process's: it is, on purpose, so the warning is kept quiet in the block. Where
    ``async_stager`` is no argument, DCP stages with its own copy (see staging.Stager.for_dcp).
    """
    accepted = dcp_parameters(name)
    wanted = {**kwargs, "no_dist": live_dist() is None}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is .*in a single process")
        yield {k: v for k, v in wanted.items() if k in accepted}


_SMALL_ITEM = 1 << 16   # bytes: an entry below this goes to the front of its rank's file


def _small_first(items: list[Any]) -> list[Any]:
    """``items`` with the small ones first (DCP's order kept within each part).

    Every rank reads the small entries of every rank's file (DCP spreads replicated entries,
    an optimizer's step counts and hyper-parameters, over the ranks' files), and a load checks
    what it reads in blocks of ``checksum.BLOCK_BYTES``: at the front, together, they cost a
    reader a block or two of another rank's file, not a block per entry (2 ranks, 290 MB: 103
    of the other rank's 145 MB were read before).
    """
    def large(item: Any) -> bool:
        data = getattr(item, "tensor_data", None)
        if data is None:
            return False
        return math.prod(data.size) * data.properties.dtype.itemsize >= _SMALL_ITEM
    try:
        return sorted(items, key=large)
    except (AttributeError, TypeError):   # a torch whose write items look otherwise: as DCP has them
        return items


def _writer(folder: Path, crcs: dict[str, tuple[str, str]]) -> Any:
    """DCP's default file writer (fsync on), with the checksums taken of every file it writes
    and each rank's small entries written first."""
    import dataclasses

    import torch.distributed.checkpoint as dcp

    from scaletrain.checkpoint.checksum import checked_filesystem

    class Writer(dcp.FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            return super().write_data(dataclasses.replace(plan, items=_small_first(plan.items)),
                                      planner)

    writer = Writer(str(folder / SUBDIR), sync_files=True)
    writer.fs = checked_filesystem(crcs)
    return writer


def save(state: dict[str, Any], folder: Path, group: Any) -> dict[str, tuple[str, str]]:
    """Write ``state`` with DCP into ``folder/sharded`` (a collective over ``group``);
    returns the checksums of each file this rank wrote (whole, blocks), by name."""
    import torch.distributed.checkpoint as dcp

    crcs: dict[str, tuple[str, str]] = {}
    with _dcp_call("save", {"storage_writer": _writer(folder, crcs), "process_group": group}) as kw:
        dcp.save(state, **kw)
    return crcs


def async_save(state: dict[str, Any], folder: Path, group: Any, *,
               stager: Any = None) -> tuple[Any, dict[str, tuple[str, str]]]:
    """Start :func:`save` in DCP's background thread; returns its future (staging is done)
    and the dict of CRCs, complete once the future is. ``stager``: DCP's ``async_stager``
    (pinned staging on a GPU, :meth:`scaletrain.checkpoint.staging.Stager.for_dcp`), None for
    DCP's default."""
    import torch.distributed.checkpoint as dcp

    crcs: dict[str, tuple[str, str]] = {}
    with _dcp_call("async_save", {"storage_writer": _writer(folder, crcs), "process_group": group,
                                  "async_stager": stager}) as kw:
        future = dcp.async_save(state, **kw)
    return future, crcs


def load(entries: list[Entry], folder: Path, stored: dict[str, dict[str, Any]], *, step: int,
         group: Any, groups: dict[str, Any], fallback: int | None, tracker: Any = None) -> None:
    """Read every entry stored sharded into the live objects (a collective over ``group``);
    every byte through ``tracker`` (``verified.Tracker``), checked as it is read."""
    wanted = [e for e in entries if stored.get(e.name, {}).get("sharded")]
    if not wanted:
        return
    _load(wanted, folder / SUBDIR, step=step, group=group, groups=groups, fallback=fallback,
          tracker=tracker)


def _load(wanted: list[Entry], path: Path, *, step: int, group: Any, groups: dict[str, Any],
          fallback: int | None, tracker: Any) -> None:
    """:func:`load`'s work: the metadata (read once, for us and for DCP), the targets, DCP."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, \
        get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict

    metadata = read_dcp_metadata(path, step=step, fallback=fallback, tracker=tracker)
    keys = list(metadata.state_dict_metadata)
    target: dict[str, Any] = {}
    for e in wanted:
        if e.kind == "pipeline":
            target[e.name] = {n: p.detach() for n, p in e.obj.named_parameters()}
        elif e.kind == "model":
            target[e.name] = get_model_state_dict(e.obj)
    # Optimizers after the models: get_optimizer_state_dict may initialise state (a zero step).
    flat_named: dict[str, dict[str, Any]] = {}
    for e in wanted:
        if e.kind != "optimizer":
            continue
        if e.named:
            flat_named[e.name] = _named_targets(e, metadata, keys)
            target.update(flat_named[e.name])
        else:
            target[e.name] = get_optimizer_state_dict(e.model, e.obj)
    # DCP loads tensors in place; where the state dict's tensors ARE the live ones (FSDP2's
    # parameters and optimizer state), a set_*_state_dict afterwards would copy every byte
    # again onto itself. Decided before the load, from the objects' own storages.
    in_place = {e.name for e in wanted if e.kind in ("model", "optimizer") and not e.named
                and _aliases_live(e, target[e.name])}
    reader = safe_reader(path, step=step, fallback=fallback, metadata=metadata, tracker=tracker)
    with _dcp_call("load", {"storage_reader": reader, "planner": safe_planner(step=step, path=path),
                            "process_group": group}) as kw:
        dcp.load(target, **kw)
    for e in wanted:
        if e.kind == "model" and e.name not in in_place:
            set_model_state_dict(e.obj, target[e.name])
    for e in wanted:
        if e.kind == "optimizer" and e.named:
            _apply_named(e, flat_named[e.name], groups.get(e.name))
        elif e.kind == "optimizer" and e.name in in_place:
            # the tensors are in place; the hyper-parameters (lr, betas...) are plain values
            for live, saved in zip(e.obj.param_groups, target[e.name]["param_groups"]):
                live.update({k: v for k, v in saved.items() if k != "params"})
        elif e.kind == "optimizer":
            set_optimizer_state_dict(e.model, e.obj, target[e.name])


def _storages(tensors: Any) -> set[int]:
    out = set()
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        out.add(local.untyped_storage().data_ptr())
    return out


def _tensor_leaves(tree: Any) -> Any:
    """Every leaf of a state dict, tensors or not."""
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _tensor_leaves(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _tensor_leaves(v)
    else:
        yield tree


def _aliases_live(entry: Entry, sd: dict[str, Any]) -> bool:
    """Whether every value of ``sd`` (the optimizer's ``state`` part) is a tensor sharing
    storage with the live model or optimizer, so DCP's in-place load is the whole load."""
    import torch

    if entry.kind == "model":
        live = _storages(list(entry.obj.parameters()) + list(entry.obj.buffers()))
        leaves = list(_tensor_leaves(sd))
    else:
        if not isinstance(sd.get("state"), dict) or not isinstance(sd.get("param_groups"), list) \
                or len(sd["param_groups"]) != len(entry.obj.param_groups):
            return False
        live = _storages(v for s in entry.obj.state.values() for v in s.values()
                         if isinstance(v, torch.Tensor))
        leaves = list(_tensor_leaves(sd["state"]))
    return bool(leaves) and all(isinstance(v, torch.Tensor) for v in leaves) and \
        _storages(leaves) <= live


def _named_targets(entry: Entry, metadata: Any, keys: list[str]) -> dict[str, Any]:
    """Empty tensors for every checkpoint key of the parameters this rank's optimizer owns."""
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    names = _param_names(entry)
    local = _local_optimizer(entry)
    out: dict[str, Any] = {}
    for g in local.param_groups:
        for p in g["params"]:
            prefix = f"{entry.name}.state.{names[id(p)]}."
            for key in keys:
                if not key.startswith(prefix):
                    continue
                meta = metadata.state_dict_metadata[key]
                if isinstance(meta, TensorStorageMetadata):
                    out[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
                else:
                    out[key] = None  # a non-tensor value, read as bytes (weights_only)
    return out


def _apply_named(entry: Entry, flat: dict[str, Any], groups: list[dict[str, Any]] | None) -> None:
    """Put the loaded per-parameter state into the local optimizer, and the hyper-parameters."""
    names = _param_names(entry)
    per_param: dict[str, dict[str, Any]] = {}
    for g in _local_optimizer(entry).param_groups:
        for p in g["params"]:
            prefix = f"{entry.name}.state.{names[id(p)]}."
            per_param[names[id(p)]] = {k[len(prefix):]: v for k, v in flat.items()
                                       if k.startswith(prefix)}
    _install(entry, per_param, groups)


def load_named_from_full(entry: Entry, saved: dict[str, Any]) -> None:
    """Load a full, name-keyed optimizer dict (written by a replicated strategy) into a
    ZeRO-1 or pipeline optimizer: each rank takes its own parameters' state."""
    _install(entry, saved.get("state", {}), saved.get("param_groups"))


def _install(entry: Entry, per_param: dict[str, dict[str, Any]],
             groups: list[dict[str, Any]] | None) -> None:
    import torch

    names = _param_names(entry)
    local = _local_optimizer(entry)
    for g in local.param_groups:
        for p in g["params"]:
            saved = per_param.get(names[id(p)])
            if not saved:
                continue
            # "step" stays where optimizers keep it (a CPU scalar unless capturable/fused)
            local.state[p] = {k: (v.to(p.device) if isinstance(v, torch.Tensor) and k != "step"
                                  else v) for k, v in saved.items()}
    if groups:
        for live_groups in {id(entry.obj.param_groups): entry.obj.param_groups,
                            id(local.param_groups): local.param_groups}.values():
            for live, old in zip(live_groups, groups):
                live.update({k: v for k, v in old.items() if k != "params"})
