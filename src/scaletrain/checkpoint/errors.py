"""Errors of the checkpointer: one line naming the step and the file, and a hint.

``CheckpointError`` (exit code 1) is a checkpoint that cannot be written or read: a
truncated or garbage file, an object torch refuses to unpickle safely, a folder from a newer
scaletrain. Bad arguments (unknown state objects, ``keep=0``, an unwritable directory) are
``scaletrain.errors.UsageError`` (exit code 2).
"""

from __future__ import annotations

from pathlib import Path

from scaletrain.contract.files import STEP_DIR_PREFIX
from scaletrain.errors import ScaletrainError


class CheckpointError(ScaletrainError):
    """A checkpoint could not be written or read; the message names the step and the file."""

    exit_code = 1


def unreadable(step: int | None, path: Path, reason: str, *, fallback: int | None = None) -> \
        CheckpointError:
    """The error for a file of a committed checkpoint that cannot be read safely."""
    where = f"checkpoint step {step}" if step is not None else "checkpoint"
    folder = path.parent if path.parent.name.startswith(STEP_DIR_PREFIX) else path.parent.parent
    if fallback is not None:
        hint = (f"the file was damaged after it was written; move {folder} aside to resume "
                f"from the previous checkpoint (step {fallback})")
    else:
        hint = (f"the file was damaged after it was written; move {folder} aside to start "
                "from scratch, or restore it from a copy")
    return CheckpointError(f"{where}: cannot read {path}: {reason}", hint=hint)


def unsafe(step: int | None, path: Path, detail: str) -> CheckpointError:
    """The error for a file that holds something other than tensors and plain values."""
    where = f"checkpoint step {step}" if step is not None else "checkpoint"
    return CheckpointError(
        f"{where}: {path} holds a pickled Python object that is not a tensor or a plain value "
        f"({detail}); refused without running it",
        hint="scaletrain loads checkpoints with torch.load(weights_only=True); only load "
             "checkpoints you wrote, and keep custom objects' state as tensors, numbers, "
             "strings, lists and dicts")
