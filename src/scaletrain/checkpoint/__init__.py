"""Checkpoints: exact resume, crash-safe folders, sharded state, async saves, exports.

``scaletrain.Checkpointer`` (in :mod:`scaletrain.checkpoint.checkpointer`) is the public entry.
Importing this package does not import torch.

Layout of a checkpoint directory::

    checkpoints/
      step-00001200/            a committed checkpoint (the newest = "latest")
        COMMIT.json             commit marker, written last: step, world size, strategy,
                                time, scaletrain/torch versions, every file of the folder
                                with its size and CRC, and a CRC per 4 MiB of it (taken
                                while writing; the load checks the very bytes it reads)
        replicated.pt           state all ranks hold alike (ddp/none/zero1 model, optimizer
                                of replicated strategies, scheduler, scaler, loader, values),
                                written once by rank 0 with torch.save
        rank-00000.pt ...       each rank's RNG states (Python, NumPy, torch, CUDA)
        sharded/                torch.distributed.checkpoint files, one shard per rank
                                (zero1 optimizer, zero2/zero3/hsdp/offload, pipeline stages)
      stop.json                 why and at which step the last run stopped on purpose
      .partial-step-00001300-1a2b3c4d/   a save in progress (or killed): ignored by loads
      damaged-step-00001100-5e6f7a8b/    a damaged checkpoint a load set aside (kept)

A save writes into a ``.partial-`` folder, fsyncs every file, renames the folder to
``step-N`` and then writes ``COMMIT.json`` (temporary file, fsync, rename): a folder without
the marker does not count, so a kill at any moment leaves the previous checkpoint as the
latest. The newest ``keep`` committed folders are kept; an older one is deleted marker first,
after the save returned (a thread of its own, joined by the next save, load or close).
Partial folders of dead writers, and ``step-N`` folders a kill left without their marker, are
removed by the next save (never one whose writer still holds its lock). To resume by hand from
an older step, move the newer folders aside. A damaged newest checkpoint (a file missing,
truncated, unlisted, or with another checksum) is set aside
as ``damaged-step-N-*`` and the newest intact one loaded, with a warning; ``strict=True`` stops.
Everything is read with ``torch.load(weights_only=True)`` (and DCP's metadata with an
allow-list): a checkpoint holding any other pickled object is refused, never run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scaletrain.checkpoint.checkpointer import Checkpointer
    from scaletrain.checkpoint.errors import CheckpointError

__all__ = ["Checkpointer", "CheckpointError"]


def __getattr__(name: str) -> Any:
    if name == "Checkpointer":
        from scaletrain.checkpoint.checkpointer import Checkpointer

        return Checkpointer
    if name == "CheckpointError":
        from scaletrain.checkpoint.errors import CheckpointError

        return CheckpointError
    raise AttributeError(f"module 'scaletrain.checkpoint' has no attribute {name!r}")
