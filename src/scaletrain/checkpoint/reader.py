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
import threading
import warnings
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from scaletrain.checkpoint import checksum, layout, replicated, sharded, stepfolder
from scaletrain.checkpoint.collect import Entry
from scaletrain.checkpoint.comm import Comm
from scaletrain.checkpoint.errors import CheckpointError, unreadable
from scaletrain.checkpoint.safeio import gc_paused, load_file
from scaletrain.checkpoint.writer import REPLICATED, rank_file
from scaletrain.errors import ScaletrainError


class _Chooser:
    """Rank 0's walk from the newest committed checkpoint to older ones, past damaged ones."""

    def __init__(self, directory: Path) -> None:
        stepfolder.clean_partials(directory)
        self.items = layout.candidates(directory)  # the order of layout.choose, the one rule
        self.bad_markers = layout.damaged(directory)
        self.skipped: list[tuple[Path, str]] = []  # (folder, why) of damaged checkpoints
        self.offered: list[layout.Committed] = []

    def next(self) -> Any:
        """``(step, folder name, marker, older step)`` of the next candidate whose files are
        all there with their sizes, an error tuple, or None when none is left."""
        while self.items:
            item = self.items.pop(0)
            fmt = item.marker.get("format", 1)
            if fmt > layout.FORMAT:  # not damage: a newer scaletrain wrote it
                return ("error", f"checkpoint step {item.step} ({item.path}) has layout format "
                                 f"{fmt}; this scaletrain reads up to {layout.FORMAT}",
                        "upgrade scaletrain to the version that wrote it "
                        f"({item.marker.get('scaletrain_version', '?')})")
            algorithm, _ = checksum.recorded(item.marker)
            if algorithm and not checksum.available(algorithm):  # not damage either
                return ("error", f"checkpoint step {item.step} ({item.path}) records "
                                 f"{algorithm.upper()} checksums and this Python cannot compute "
                                 "them: the crc32c package is missing",
                        "pip install crc32c (a dependency of scaletrain) into the job's "
                        "environment")
            problem = layout.verify_files(item.path, item.marker)
            if problem is None:
                self.offered.append(item)
                return (item.step, item.path.name, item.marker, self.older())
            self.skipped.append((item.path, problem))
        return None

    def older(self) -> int | None:
        """The step of the next candidate, for hints."""
        return self.items[0].step if self.items else None

    def intact(self) -> int | None:
        """The newest step offered or left that is not known to be damaged, for hints."""
        bad = {path for path, _ in self.skipped}
        return next((i.step for i in self.offered + self.items if i.path not in bad), None)


def _share(files: dict[str, Any], rank: int, world: int) -> list[str]:
    """The files whose checksums ``rank`` checks: its own rank file and DCP shard (it reads
    them anyway, so they are in its page cache after), the rest on rank 0."""
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


def verify_share(folder: Path, marker: dict[str, Any], rank: int, world: int) -> str | None:
    """The first checksum mismatch among this rank's share of the files, or None.

    Checkpoints written before checksums existed have none to check (their sizes are).
    """
    return checksum.first_mismatch(folder, marker, _share(marker["files"], rank, world))


def _report(chooser: _Chooser, choice: Any, strict: bool) -> tuple[str, str] | None:
    """Rank 0: the error to raise on every rank (or None), after warning about damage."""
    found = choice is not None and choice[0] not in ("error", "damaged")
    step = choice[0] if found else None
    newer_bad = [(p, why) for s, p, why in chooser.bad_markers if step is None or s > step]
    damage = chooser.skipped + newer_bad
    if not damage:
        return None
    first, why = damage[0]
    if strict or not found:
        older = chooser.intact()
        hint = (f"move {first} aside to resume from the previous checkpoint (step {older})"
                if older is not None and strict else
                "restore the checkpoint from a copy, or move the damaged folders aside to "
                "start from scratch")
        what = "is damaged" if strict else "is damaged and no older intact one is left"
        return (f"checkpoint {first} {what}: {why}", hint)
    for folder, reason in damage:
        kept = layout.set_aside(folder)
        warnings.warn(f"checkpoint {folder} is damaged ({reason}); resuming from step {step} "
                      f"instead; the damaged folder is kept as {kept or folder} for "
                      "inspection (Checkpointer(..., strict=True) stops instead)", stacklevel=4)
    return None


class _Verifier:
    """This rank's share of the checksums, checked in a thread while the load reads the same
    files (zlib releases the GIL): the check costs no extra pass in the load's time where a
    core is free, and the verdict is agreed before the load counts."""

    def __init__(self, folder: Path, marker: dict[str, Any], rank: int, world: int) -> None:
        self.problem: str | None = None
        self._thread = threading.Thread(target=self._run, args=(folder, marker, rank, world),
                                        name="scaletrain-verify", daemon=True)
        self._thread.start()

    def _run(self, folder: Path, marker: dict[str, Any], rank: int, world: int) -> None:
        self.problem = verify_share(folder, marker, rank, world)

    def result(self) -> str | None:
        self._thread.join()
        return self.problem


def load(directory: Path, entries: list[Entry], state: MutableMapping[str, Any], comm: Comm,
         device: Any, *, strict: bool = False) -> int | None:
    """Load the newest intact committed checkpoint into ``entries``; its step, or None.

    Rank 0 walks from the newest committed checkpoint down (files all there with their
    sizes); every rank checks the checksums of its share of the files while the load runs,
    and the verdicts are agreed after it. A damaged checkpoint (a file missing, truncated or
    with another checksum) raises with ``strict``; otherwise it is renamed
    ``damaged-step-N-*`` (kept for inspection), rank 0 warns naming it and the file, and the
    next older one is loaded over whatever the damaged one put into the objects. No intact
    checkpoint left after a damaged one: an error (a fresh start would silently throw the
    training away).
    """
    with gc_paused():  # the training thread waits for the load anyway
        return _load(directory, entries, state, comm, device, strict=strict)


def _load(directory: Path, entries: list[Entry], state: MutableMapping[str, Any], comm: Comm,
          device: Any, *, strict: bool) -> int | None:
    chooser = _Chooser(directory) if comm.rank == 0 else None
    while True:
        offer = chooser.next() if chooser is not None else None
        if chooser is not None and chooser.skipped and strict:
            offer = ("damaged",)
        choice = comm.broadcast(offer)
        if choice is None or choice[0] in ("error", "damaged"):
            break
        folder = directory / choice[1]
        verifier = _Verifier(folder, choice[2], comm.rank, comm.world_size)
        failure: BaseException | None = None
        try:
            _load_into(choice, folder, entries, state, comm, device)
        except (Exception, _dcp_exception()) as err:  # a damaged file may fail the load
            failure = err
        problems = comm.gather(verifier.result())
        bad = comm.broadcast(next((p for p in problems or [] if p), None))
        if bad is None:
            if failure is not None:
                raise failure
            break
        if chooser is not None:
            chooser.skipped.append((folder, bad))
        if strict:
            choice = ("damaged",)
            break
    # every rank has the same choice here; the damage report comes from rank 0
    report = comm.broadcast(_report(chooser, choice, strict) if chooser is not None else None)
    if report is not None:
        raise CheckpointError(report[0], hint=report[1])
    if choice is not None and choice[0] == "error":
        raise CheckpointError(choice[1], hint=choice[2])
    return None if choice is None else int(choice[0])


def _load_into(choice: Any, folder: Path, entries: list[Entry],
               state: MutableMapping[str, Any], comm: Comm, device: Any) -> None:
    """Read the chosen checkpoint into the objects (every rank)."""
    step, _, marker, previous = choice
    stored: dict[str, dict[str, Any]] = marker.get("objects", {})
    _check_names(step, entries, stored, comm.rank)

    payload = load_file(folder / REPLICATED, step=step, map_location=device, fallback=previous)
    _check_payload(step, folder / REPLICATED, payload, entries, stored, previous)
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
        path = folder / rank_file(comm.rank)
        local = load_file(path, step=step, map_location="cpu", fallback=previous)
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
