"""Where an async save copies the state before training goes on: CPU memory, pinned on a GPU.

An async save (``Checkpointer(async_save=True)``) pauses training only while the state is
copied off the device; the files are written afterwards in a thread. From a GPU, a copy into
ordinary (pageable) memory goes through a driver bounce buffer, one tensor at a time; into
page-locked (pinned) memory it runs at the link's speed, and the copies can be queued without
waiting (``non_blocking``) and waited for once. Pinning memory is itself slow (it is a system
call that locks every page), so a :class:`Stager` keeps its pinned buffers from one save to the
next: the second and later saves of a run only copy. That costs host memory the size of this
rank's staged state for as long as the Checkpointer lives (released by ``close()``).

- Replicated and per-rank objects (``replicated.pt``, ``rank-N.pt``): copied here, tensor by
  tensor, into buffers matched by their position in the state, then one device synchronisation.
- Sharded state (DCP): DCP's own stager (``torch.distributed.checkpoint.staging.DefaultStager``
  with pinned memory and non-blocking copies), kept between saves for the same reason.

On the CPU (and for tensors already on the CPU) nothing is pinned: a plain copy, as before.
"""

from __future__ import annotations

from typing import Any, Callable

from scaletrain.torch_features import dcp_default_stager


def on_accelerator(obj: Any) -> bool:
    """Whether ``obj`` (a nested state of dicts, lists and tuples) holds a tensor off the CPU."""
    if hasattr(obj, "device") and hasattr(obj, "detach"):
        return getattr(obj.device, "type", "cpu") != "cpu"
    if isinstance(obj, dict):
        return any(on_accelerator(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(on_accelerator(v) for v in obj)
    return False


def copy_tree(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """A copy of ``obj`` with every tensor replaced by ``leaf(tensor)`` (DTensors as their
    local shard), in a fixed walk order; other values are kept as they are."""
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if hasattr(t, "full_tensor") and type(t).__name__ == "DTensor":
            t = getattr(t, "to_local")()
        return leaf(t)
    if isinstance(obj, dict):
        return type(obj)((k, copy_tree(v, leaf)) for k, v in obj.items()) if type(obj) is not dict \
            else {k: copy_tree(v, leaf) for k, v in obj.items()}
    if isinstance(obj, list):
        return [copy_tree(v, leaf) for v in obj]
    if isinstance(obj, tuple):
        return tuple(copy_tree(v, leaf) for v in obj)
    return obj


def plain_copy(t: Any) -> Any:
    """A tensor's copy in ordinary CPU memory."""
    return t.to("cpu", copy=True)


class Stager:
    """Copies of the state in CPU memory for one Checkpointer's async saves.

    Args:
        pin: pin the buffers of state held on an accelerator (default True; tests of the
            bookkeeping pass False, since a CPU-only torch cannot pin).
    """

    def __init__(self, *, pin: bool = True) -> None:
        self.pin = pin
        self._buffers: list[Any] = []   # this rank's pinned buffers, in walk order
        self._next = 0
        self._dcp: Any = None           # DCP's DefaultStager, made at the first sharded GPU save
        self.allocated = 0              # buffers made (a later save that makes none reused them all)

    def stage(self, obj: Any) -> Any:
        """A copy of ``obj`` in CPU memory; from an accelerator into reused (pinned) buffers.

        One call per save, with everything the save writes: each call refills the buffers of
        the previous one (they are matched by position in the walk), so the copies a call
        returns hold until the next call.
        """
        if not on_accelerator(obj):
            return copy_tree(obj, plain_copy)
        self._next = 0
        staged = copy_tree(obj, self._into_buffer)
        self._synchronize()
        return staged

    def _into_buffer(self, t: Any) -> Any:
        import torch

        # a CPU tensor of a state that is mostly on the GPU (CPU offload) goes into a buffer too
        i, self._next = self._next, self._next + 1
        buf = self._buffers[i] if i < len(self._buffers) else None
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin)
            self.allocated += 1
            if i < len(self._buffers):
                self._buffers[i] = buf
            else:
                self._buffers.append(buf)
        # queued on the current stream; waited for once, after the whole walk
        buf.copy_(t, non_blocking=self.pin)
        # each staged tensor is a view of its buffer: the writer reads it, the next save refills it
        return buf

    def _synchronize(self) -> None:
        import torch

        if self.pin and torch.cuda.is_available():  # ROCm builds answer here too
            torch.cuda.synchronize()

    def for_dcp(self, state: Any) -> Any:
        """The ``async_stager`` for ``dcp.async_save`` of ``state``: DCP's stager with pinned,
        non-blocking copies when the state is on an accelerator, None (DCP's default) otherwise."""
        if not (self.pin and on_accelerator(state)) or not dcp_default_stager():
            return None  # (a torch before 2.9 has no DefaultStager: DCP's own staging copy)
        if self._dcp is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            # synchronous staging (async_save returns when the copy is done, as without a GPU),
            # pinned and non-blocking; no shared memory (that is for a saving process, unused)
            self._dcp = DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                                     use_async_staging=False, use_non_blocking_copy=True))
        return self._dcp

    def close(self) -> None:
        """Release the pinned buffers (DCP's and ours)."""
        self._buffers = []
        if self._dcp is not None:
            self._dcp.close()
            self._dcp = None
