"""Consolidated model weights in one file, for inference, from any strategy.

The file is a plain ``state_dict`` (parameter and buffer names of the unwrapped model, full
tensors on the CPU) that ``torch.load(path, weights_only=True)`` reads and
``model.load_state_dict`` accepts on a model that was never wrapped. Unlike a checkpoint this
*gathers*: under FSDP2 every full tensor is assembled (``get_model_state_dict`` with
``full_state_dict=True, cpu_offload=True``: one tensor at a time, on rank 0's host memory),
and a pipeline's stages are collected from their ranks - so rank 0 needs host memory for the
whole model. Call it on every rank; rank 0 writes (atomically) and returns the path, the
others return None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaletrain.checkpoint.collect import is_pipeline
from scaletrain.errors import UsageError
from scaletrain.fileio import atomic_file
from scaletrain.runtime.current import group_rank_world


def export(path: str | Path, model: Any) -> Path | None:
    """Write ``model``'s full weights to ``path`` on rank 0 (a collective); see the module doc."""
    import torch

    if not (is_pipeline(model) or isinstance(model, torch.nn.Module)):
        raise UsageError(f"export() takes the model, got {type(model).__name__}",
                         hint="e.g. ckpt.export('model.pt', model)")
    target = Path(path).expanduser().absolute()
    if is_pipeline(model):
        full = model.full_state_dict()
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, \
            get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                    cpu_offload=True))
        full = {k: v.detach().cpu() for k, v in full.items() if isinstance(v, torch.Tensor)}
    rank, world = group_rank_world()
    result: Path | None = None
    error: str | None = None
    if rank == 0:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(target) as fh:   # streamed: the weights are not held twice
                torch.save(full, fh)
            result = target
        except OSError as err:
            error = f"cannot write {target}: {err.strerror or err}"
    if world > 1:
        from scaletrain.runtime import collectives

        error = collectives.broadcast_object(error, src=0)
    if error:
        raise UsageError(error, hint="export to a writable path")
    return result
