"""Loading the latest committed checkpoint into live objects, on every rank.

Rank 0 picks the folder (the newest committed one) and checks that the marker's files are
all there with their sizes; every rank then reads with ``map_location`` = its own device,
tensors only (``weights_only=True``). Same world size: each rank gets its own RNG states back.
Another world size: sharded state is resharded by DCP, replicated state loads as is, the
loader continues the epoch's order on the new world, and RNG states are *not* restored (the
old ranks' streams have no meaning for the new ranks; each rank keeps the seeds the script
set) - rank 0 says so once.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from scaletrain.checkpoint import layout, replicated, sharded
from scaletrain.checkpoint.collect import Entry
from scaletrain.checkpoint.comm import Comm
from scaletrain.checkpoint.errors import CheckpointError, unreadable
from scaletrain.checkpoint.safeio import load_file
from scaletrain.checkpoint.writer import REPLICATED, rank_file
from scaletrain.errors import ScaletrainError


def choose(directory: Path) -> Any:
    """Rank 0's choice: ``(step, folder name, marker, previous step)``, an error tuple, or None."""
    layout.clean_partials(directory)
    items = layout.committed(directory)
    if not items:
        return None
    item = items[-1]
    previous = items[-2].step if len(items) > 1 else None
    fmt = item.marker.get("format", 1)
    if not isinstance(fmt, int) or fmt > layout.FORMAT:
        return ("error", f"checkpoint step {item.step} ({item.path}) has layout format {fmt}; "
                         f"this scaletrain reads up to {layout.FORMAT}",
                "upgrade scaletrain to the version that wrote it "
                f"({item.marker.get('scaletrain_version', '?')})")
    problem = layout.verify_files(item.path, item.marker)
    if problem:
        err = unreadable(item.step, item.path / problem.split(" ", 1)[0], problem,
                         fallback=previous)
        return ("error", err.message, err.hint)
    return (item.step, item.path.name, item.marker, previous)


def load(directory: Path, entries: list[Entry], state: MutableMapping[str, Any], comm: Comm,
         device: Any) -> int | None:
    """Load the newest committed checkpoint into ``entries``; its step, or None if none."""
    choice = comm.broadcast(choose(directory) if comm.rank == 0 else None)
    if choice is None:
        return None
    if choice[0] == "error":
        raise CheckpointError(choice[1], hint=choice[2])
    step, name, marker, previous = choice
    folder = directory / name
    stored: dict[str, dict[str, Any]] = marker.get("objects", {})
    _check_names(step, entries, stored, comm.rank)

    payload = load_file(folder / REPLICATED, step=step, map_location=device, fallback=previous)
    try:
        replicated.apply(entries, payload, state, stored)
        _load_sharded(entries, folder, stored, step, comm, payload.get("groups", {}), previous)
    except ScaletrainError:
        raise
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        raise CheckpointError(
            f"checkpoint step {step} ({folder}) does not fit the objects given: "
            f"{_first_line(err)}",
            hint="load into the same model and optimizer classes and shapes that were saved "
                 "(a different architecture needs a fresh directory)") from err

    same_world = marker.get("world_size") == comm.world_size
    if same_world:
        local = load_file(folder / rank_file(comm.rank), step=step, map_location="cpu",
                          fallback=previous)
        replicated.apply_local(entries, local, same_world=True)
    elif comm.rank == 0:
        warnings.warn(
            f"checkpoint step {step} was written by {marker.get('world_size')} processes and "
            f"this job has {comm.world_size}: model, optimizer and loader state are loaded "
            "(sharded state resharded), but random-number generator states are not restored; "
            "each rank keeps the seeds your script set", stacklevel=3)
    return int(step)


def _load_sharded(entries: list[Entry], folder: Path, stored: dict[str, dict[str, Any]],
                  step: int, comm: Comm, groups: dict[str, Any], previous: int | None) -> None:
    try:
        sharded.load(entries, folder, stored, step=step, group=comm.group, groups=groups,
                     fallback=previous)
    except ScaletrainError:
        raise
    except (Exception, _dcp_exception()) as err:  # DCP wraps each rank's failure
        inner = _scaletrain_cause(err)
        if inner is not None:
            raise inner from None
        if type(err).__name__ != "CheckpointException":
            raise
        raise unreadable(step, folder / sharded.SUBDIR, f"truncated or corrupt "
                         f"({_first_line(err)})", fallback=previous) from None


def _dcp_exception() -> type[BaseException]:
    """DCP's CheckpointException: a BaseException carrying every rank's (error, trace)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


def _scaletrain_cause(err: BaseException) -> ScaletrainError | None:
    """The ScaletrainError some rank raised inside a DCP collective, if any."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict):
        for failure in failures.values():
            if isinstance(failure, tuple) and failure:
                failure = failure[0]
            if isinstance(failure, ScaletrainError):
                return failure
            inner = _scaletrain_cause(failure)
            if inner is not None:
                return inner
    cause = err.__cause__ or err.__context__
    if isinstance(cause, ScaletrainError):
        return cause
    return None


def _check_names(step: int, entries: list[Entry], stored: dict[str, Any], rank: int) -> None:
    missing = [e.name for e in entries if e.name not in stored]
    if missing:
        raise CheckpointError(
            f"checkpoint step {step} holds no {', '.join(repr(m) for m in missing)}; it holds "
            f"{', '.join(repr(s) for s in stored) or 'nothing'}",
            hint="resume with the same state names the checkpoint was saved with")
    extra = [name for name in stored if name not in {e.name for e in entries}]
    if extra and rank == 0:
        print(f"scaletrain: checkpoint step {step}: not loaded (not in this state): "
              f"{', '.join(extra)}", file=sys.stderr, flush=True)


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:300]
