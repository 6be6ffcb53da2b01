"""Loading the latest committed checkpoint into live objects, on every rank.

Rank 0 asks :func:`layout.choose` (the one rule for "the latest checkpoint": the newest committed
folder whose files are all there, listed, with their sizes) and hands its answer to every rank;
every rank then reads with ``map_location`` = its own device, tensors only
(``weights_only=True``), each byte checked against the marker's checksums as it is read
(:mod:`scaletrain.checkpoint.verified`: what is deserialized is what was checked). After the load
each rank checks the rest of its share of the files, and the verdicts are agreed: a damaged
checkpoint is passed over for the next older one. Same world size: each rank gets its own RNG
states back. Another world size: sharded state is resharded by DCP, replicated state loads as
is, the loader continues the epoch's order on the new world, and RNG states are *not* restored
(the old ranks' streams have no meaning for the new ranks; each rank keeps the seeds the script
set) - rank 0 says so once.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from scaletrain.checkpoint import layout, replicated, sharded, stepfolder, verified
from scaletrain.checkpoint.collect import Entry
from scaletrain.checkpoint.comm import Comm
from scaletrain.checkpoint.errors import CheckpointError, unreadable
from scaletrain.checkpoint.marker import REPLICATED, rank_file
from scaletrain.checkpoint.safeio import gc_paused, load_file
from scaletrain.errors import ScaletrainError


def _share(files: dict[str, Any], rank: int, world: int) -> list[str]:
    """The files whose unread blocks ``rank`` checks after the load: its own rank file and DCP
    shard (it read most of them anyway), the rest on rank 0."""
    mine = []
    for rel in files:
        owner = 0
        name = rel.rsplit("/", 1)[-1]
        if rel.startswith("rank-") and rel[5:10].isdigit():
            owner = int(rel[5:10]) % world
        elif rel.startswith(f"{sharded.SUBDIR}/__") and name[2:].split("_", 1)[0].isdigit():
            owner = int(name[2:].split("_", 1)[0]) % world
        if owner == rank:
            mine.append(rel)
    return mine


def _offer(choice: layout.Choice, strict: bool) -> Any:
    """Rank 0: what every rank does next, from the rule's choice: ``("load", step, folder name,
    marker, older step)``, ``("stop",)`` (nothing to load, or damage under ``strict``)."""
    if choice.refusal is not None or choice.item is None or (strict and choice.damage()):
        return ("stop",)
    item = choice.item
    return ("load", item.step, item.path.name, item.marker, choice.older)


def _report(choice: layout.Choice | None, strict: bool) -> tuple[str, str] | None:
    """Rank 0: the error to raise on every rank (or None), after warning about damage."""
    if choice is None:
        return None
    if choice.refusal is not None:
        return choice.refusal
    damage = choice.damage()
    if not damage:
        return None
    first, why = damage[0]
    if strict or choice.item is None:
        hint = (f"move {first} aside to resume from the previous checkpoint (step {choice.step})"
                if choice.item is not None else
                "restore the checkpoint from a copy, or move the damaged folders aside to "
                "start from scratch")
        what = "is damaged" if strict else "is damaged and no older intact one is left"
        return (f"checkpoint {first} {what}: {why}", hint)
    for folder, reason in damage:
        kept = layout.set_aside(folder)
        warnings.warn(f"checkpoint {folder} is damaged ({reason}); resuming from step "
                      f"{choice.step} instead; the damaged folder is kept as {kept or folder} for "
                      "inspection (Checkpointer(..., strict=True) stops instead)", stacklevel=4)
    return None


def load(directory: Path, entries: list[Entry], state: MutableMapping[str, Any], comm: Comm,
         device: Any, *, strict: bool = False) -> int | None:
    """Load the newest intact committed checkpoint into ``entries``; its step, or None.

    Rank 0 asks the rule (:func:`layout.choose`: the newest committed checkpoint whose files
    are all there, listed, with their sizes); every rank loads it, checking each byte it reads,
    and the rest of its share of the files after; the verdicts are agreed. A damaged
    checkpoint (a file missing, truncated, unlisted, or with another checksum) raises with
    ``strict``; otherwise it is renamed ``damaged-step-N-*`` (kept for inspection), rank 0
    warns naming it and the file, and the next older one is loaded over whatever the damaged
    one put into the objects. No intact checkpoint left after a damaged one: an error (a fresh
    start would silently throw the training away).
    """
    with gc_paused():  # the training thread waits for the load anyway
        return _load(directory, entries, state, comm, device, strict=strict)


def _load(directory: Path, entries: list[Entry], state: MutableMapping[str, Any], comm: Comm,
          device: Any, *, strict: bool) -> int | None:
    found: dict[Path, str] = {}           # folders a load found damaged, and why
    choice: layout.Choice | None = None
    if comm.rank == 0:
        stepfolder.clean_partials(directory)
    while True:
        if comm.rank == 0:
            choice = layout.choose(directory, skip=found, verify_bytes=0)  # the load reads every byte
        offer = comm.broadcast(_offer(choice, strict) if choice is not None else None)
        if offer[0] != "load":
            break
        folder = directory / offer[2]
        tracker = verified.Tracker(folder, offer[3])
        problem, failure = None, None
        try:
            _load_into(offer, folder, entries, state, comm, device, tracker)
        except verified.Damaged as err:
            problem = err.problem
        except (Exception, _dcp_exception()) as err:  # a damaged file may fail the load
            damaged = _damage_in(err)
            problem, failure = (damaged.problem, None) if damaged is not None else (None, err)
        problem = problem or tracker.finish(_share(offer[3]["files"], comm.rank, comm.world_size))
        problems = comm.gather(problem)
        bad = comm.broadcast(next((p for p in problems or [] if p), None))
        if bad is None:
            if failure is not None:
                raise failure
            break
        found[folder] = bad
    # every rank has the same offer here; the damage report comes from rank 0
    report = comm.broadcast(_report(choice, strict) if comm.rank == 0 else None)
    if report is not None:
        raise CheckpointError(report[0], hint=report[1])
    return int(offer[1]) if offer[0] == "load" else None


def _load_into(offer: Any, folder: Path, entries: list[Entry], state: MutableMapping[str, Any],
               comm: Comm, device: Any, tracker: verified.Tracker) -> None:
    """Read the chosen checkpoint into the objects (every rank), every file through ``tracker``."""
    _, step, _, marker, previous = offer
    stored: dict[str, dict[str, Any]] = marker.get("objects", {})
    _check_names(step, entries, stored, comm.rank)

    with tracker.open(REPLICATED) as source:
        payload = load_file(folder / REPLICATED, step=step, map_location=device,
                            fallback=previous, source=source)
    _check_payload(step, folder / REPLICATED, payload, entries, stored, previous)
    try:
        replicated.apply(entries, payload, state, stored)
        _load_sharded(entries, folder, stored, step, comm, payload.get("groups", {}), previous,
                      tracker)
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
        path = folder / rank_file(comm.rank)
        with tracker.open(rank_file(comm.rank)) as source:
            local = load_file(path, step=step, map_location="cpu", fallback=previous, source=source)
        try:
            replicated.apply_local(entries, local, same_world=True)
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError,
                OverflowError) as err:
            raise unreadable(step, path, "its random-number generator states or per-rank "
                             f"objects are missing or malformed ({_first_line(err)})",
                             fallback=previous) from None
    elif comm.rank == 0:
        warnings.warn(
            f"checkpoint step {step} was written by {marker.get('world_size')} processes and "
            f"this job has {comm.world_size}: model, optimizer and loader state are loaded "
            "(sharded state resharded), but random-number generator states (and per-rank "
            "objects) are not restored; each rank keeps the seeds your script set",
            stacklevel=4)


_SECTIONS = {"value": "values", "object": "objects", "model": "models",
             "optimizer": "optimizers"}


def _check_payload(step: int, path: Path, payload: Any, entries: list[Entry],
                   stored: dict[str, dict[str, Any]], previous: int | None) -> None:
    """The replicated file holds what the marker lists; otherwise it is damaged (not a
    different architecture, which only ``load_state_dict`` itself can tell)."""
    if not isinstance(payload, dict):
        raise unreadable(step, path, f"it holds a {type(payload).__name__}, not a checkpoint",
                         fallback=previous)
    for e in entries:
        section = _SECTIONS.get(e.kind)
        if section is None or stored.get(e.name, {}).get("sharded"):
            continue
        part = payload.get(section)
        if not isinstance(part, dict) or e.name not in part:
            raise unreadable(step, path, f"it holds no {section[:-1]} {e.name!r} although the "
                             "commit marker lists it (corrupt)", fallback=previous)
        if e.kind in ("model", "optimizer") and not isinstance(part[e.name], dict):
            raise unreadable(step, path, f"the state of {e.name!r} is a "
                             f"{type(part[e.name]).__name__}, not a state dict (corrupt)",
                             fallback=previous)


def _load_sharded(entries: list[Entry], folder: Path, stored: dict[str, dict[str, Any]],
                  step: int, comm: Comm, groups: dict[str, Any], previous: int | None,
                  tracker: verified.Tracker) -> None:
    try:
        sharded.load(entries, folder, stored, step=step, group=comm.group, groups=groups,
                     fallback=previous, tracker=tracker)
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


def _damage_in(err: BaseException) -> verified.Damaged | None:
    """The checksum mismatch behind ``err`` (raised here or on another rank inside DCP), if any."""
    cause = err if isinstance(err, ScaletrainError) else _scaletrain_cause(err)
    return cause if isinstance(cause, verified.Damaged) else None


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
