"""The collectives scaletrain issues, each done when it returns: no work of torch's still holds
one of its tensors.

torch's collectives return once the work is complete, but a gloo worker thread drops the work
only afterwards; a tensor whose Python object is gone by then (a temporary, or the buffers
inside ``broadcast_object_list``) is freed by that worker, which takes the GIL for it. A
``destroy_process_group()`` that comes first joins the worker while holding the GIL: a deadlock
(runtime/settle.py). So every collective here holds its tensors until torch's threads have
let go of them (:func:`settle.let_go`), and the object collectives pickle into tensors of
their own instead of torch's ``*_object`` functions, whose buffers the caller never sees.

Same arguments and results as torch's (``src``/``dst`` are global ranks); a tensor lives on
:func:`~scaletrain.runtime.current.collective_device` of its group.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.runtime import settle
from scaletrain.runtime.current import collective_device


def _done(start: Callable[..., Any], tensors: Sequence[torch.Tensor], *args: Any,
          **kwargs: Any) -> None:
    """Run one collective over ``tensors`` and return once torch's threads let go of them."""
    before = settle.holders(tensors)
    start(*args, async_op=True, **kwargs).wait()  # the Work is not kept: only torch holds it now
    settle.let_go(tensors, before)


def all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None) -> None:
    """``dist.all_reduce`` in place (default op: SUM)."""
    _done(dist.all_reduce, [tensor], tensor, op=dist.ReduceOp.SUM if op is None else op,
          group=group)


def broadcast(tensor: torch.Tensor, src: int = 0, group: Any = None) -> None:
    """``dist.broadcast`` in place, from global rank ``src``."""
    _done(dist.broadcast, [tensor], tensor, src=src, group=group)


def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None, dst: int = 0,
           group: Any = None) -> None:
    """``dist.gather``: every rank's ``tensor`` into ``gather_list`` on global rank ``dst``."""
    _done(dist.gather, [tensor, *(gather_list or [])], tensor, gather_list=gather_list, dst=dst, group=group)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None, src: int = 0,
            group: Any = None) -> None:
    """``dist.scatter``: global rank ``src``'s ``scatter_list[r]`` into ``tensor`` on rank r."""
    _done(dist.scatter, [tensor, *(scatter_list or [])], tensor, scatter_list=scatter_list, src=src, group=group)


ReduceOp = dist.ReduceOp   # so that this module reads as torch.distributed's collectives do


def _to_tensor(obj: Any, device: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)


def _from_tensor(tensor: torch.Tensor, size: int) -> Any:
    return pickle.loads(tensor[:size].cpu().numpy().tobytes())


def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    """Global rank ``src``'s ``obj`` on every rank of ``group`` (``src`` gets its own back)."""
    device = collective_device(group)
    mine = dist.get_rank() == src
    payload = _to_tensor(obj, device) if mine else torch.empty(0, dtype=torch.uint8)
    size = torch.tensor([payload.numel()], dtype=torch.long, device=device)
    broadcast(size, src=src, group=group)
    if not mine:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    broadcast(payload, src=src, group=group)
    return obj if mine else _from_tensor(payload, payload.numel())


def _sizes_and_padded(obj: Any, group: Any) -> tuple[list[int], torch.Tensor]:
    """Every rank's pickled size, and this rank's pickle padded to the largest."""
    device = collective_device(group)
    payload = _to_tensor(obj, device)
    world = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    mine = torch.tensor([payload.numel()], dtype=torch.long, device=device)
    _done(dist.all_gather, [*sizes, mine], sizes, mine, group=group)
    counts = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(counts), dtype=torch.uint8, device=device)
    padded[:payload.numel()] = payload
    return counts, padded


def all_gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj``, a list by rank in ``group``, on every rank."""
    counts, padded = _sizes_and_padded(obj, group)
    out = [torch.empty_like(padded) for _ in counts]
    _done(dist.all_gather, [*out, padded], out, padded, group=group)
    return [_from_tensor(t, n) for t, n in zip(out, counts)]


def gather_objects(obj: Any, dst: int = 0, group: Any = None) -> list[Any] | None:
    """Every rank's ``obj`` on global rank ``dst`` (a list by rank in ``group``); None elsewhere."""
    counts, padded = _sizes_and_padded(obj, group)
    out = [torch.empty_like(padded) for _ in counts] if dist.get_rank() == dst else None
    _done(dist.gather, [*(out or []), padded], padded, gather_list=out, dst=dst, group=group)
    return None if out is None else [_from_tensor(t, n) for t, n in zip(out, counts)]
