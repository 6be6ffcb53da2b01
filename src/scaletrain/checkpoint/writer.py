"""One save, in two halves: :meth:`SaveJob.prepare` in the training thread (agree on the
folder, take the state dicts, copy them to CPU for an async save), then :meth:`SaveJob.run`
(write, fsync, gather every rank's file list, commit) - inline, or in a background thread.

Files of ``step-N/``:

- ``replicated.pt``: rank 0's ``torch.save`` of everything every rank holds alike;
- ``rank-00000.pt`` ...: each rank's RNG states and per-rank objects;
- ``sharded/``: DCP's files (``__R_0.distcp`` per rank, ``.metadata``) for sharded state;
- ``COMMIT.json``: the marker, written last by rank 0.
"""

from __future__ import annotations

import datetime
import os
import threading
import traceback
from pathlib import Path
from typing import Any

from scaletrain.checkpoint import checksum, layout, replicated, sharded, stepfolder
from scaletrain.checkpoint.collect import Entry, strategy_name
from scaletrain.checkpoint.comm import Comm
from scaletrain.checkpoint.errors import CheckpointError
from scaletrain.checkpoint.marker import REPLICATED, rank_file
from scaletrain.checkpoint.safeio import save_file
from scaletrain.checkpoint.staging import Stager
from scaletrain.fileio import fsync_dir

_SPACE_HINT = ("the previous checkpoint is intact; check free space and quota (e.g. `lfs quota` "
               "on Lustre)")


class SaveJob:
    """The state of one save between its two halves."""

    def __init__(self, directory: Path, step: int, entries: list[Entry], comm: Comm, *,
                 keep: int, stager: Stager | None, pinned: Stager | None = None) -> None:
        self.directory = directory
        self.step = step
        self.entries = entries
        self.comm = comm
        self.keep = keep
        self.stager = stager  # async: copy to CPU now (with this), write later
        self.pinned = pinned  # blocking: where the replicated payload's GPU tensors go first
        self.folder: stepfolder.PartialFolder | None = None
        self.path: Path | None = None
        self.payload: dict[str, Any] | None = None
        self.local: dict[str, Any] | None = None
        self.sharded_state: dict[str, Any] | None = None
        self.sharded_future: Any = None
        self.sharded_crcs: dict[str, tuple[str, str]] = {}

    # -- first half: training thread, all ranks ---------------------------------------
    def prepare(self) -> None:
        """Agree on the partial folder and take (or stage) the state. A collective."""
        name: Any = None
        if self.comm.rank == 0:
            try:
                stepfolder.clean_partials(self.directory)
                stepfolder.check_single_writer(self.directory)
                self.folder = stepfolder.PartialFolder(self.directory, self.step)
                self.folder.create()
                name = self.folder.path.name
            except CheckpointError as err:
                name = ("error", err.message, err.hint)
            except OSError as err:
                name = ("error", f"cannot create a folder in {self.directory}: {err}",
                        "check the file system's free space and permissions")
        name = self.comm.broadcast(name)
        if isinstance(name, tuple):
            raise CheckpointError(f"checkpoint step {self.step}: {name[1]}", hint=name[2])
        self.path = self.directory / name
        try:
            self.payload = replicated.collect(self.entries) if self.comm.rank == 0 else None
            self.local = replicated.collect_local(self.entries)
            self.sharded_state = sharded.collect(self.entries)
            if self.stager is not None:
                # one walk for both trees: the stager's buffers are matched by position within
                # a call, so a second call would refill the first tree's buffers
                self.payload, self.local = self.stager.stage((self.payload, self.local))
                if self.sharded_state:
                    # DCP stages to CPU before returning, then writes in its own thread
                    self.sharded_future, self.sharded_crcs = sharded.async_save(
                        self.sharded_state, self.path, self.comm.group,
                        stager=self.stager.for_dcp(self.sharded_state))
                    self.sharded_state = None
            elif self.pinned is not None:
                self.payload = replicated.staged(self.payload, self.pinned)
        except BaseException:
            self.abandon()
            raise

    # -- second half: inline or background thread, all ranks --------------------------
    def run(self) -> Path:
        """Write this rank's files, wait for every rank's, commit on rank 0. A collective."""
        assert self.path is not None  # set by prepare()
        problem: str | None = None
        files: dict[str, int] = {}
        crcs: dict[str, tuple[str, str]] = {}   # file: (whole file's checksum, its blocks')
        own: list[tuple[str, Any]] = [(REPLICATED, self.payload)] if self.payload is not None \
            else []
        own.append((rank_file(self.comm.rank), self.local))
        small = _Background(self._write_own, own, files, crcs)
        if self.sharded_future is None and not self.sharded_state:
            small.join()  # nothing to overlap with
        # DCP is a collective of its own (it gathers plans and errors itself); our own files
        # are written (and fsynced) meanwhile in a thread, not before it
        try:
            with checksum.our_crc_only():
                if self.sharded_future is not None:
                    self.sharded_future.result()
                elif self.sharded_state:
                    self.sharded_crcs = sharded.save(self.sharded_state, self.path,
                                                     self.comm.group)
            crcs.update({f"{sharded.SUBDIR}/{n}": c for n, c in self.sharded_crcs.items()})
        except BaseException as err:
            problem = f"rank {self.comm.rank}: sharded state: {_short(err)}"
        finally:
            self.sharded_state = self.sharded_future = None
        failed = small.join()
        self.payload = self.local = None  # the copies can go now
        if failed is not None:  # reported to rank 0, which abandons the save
            problem = f"rank {self.comm.rank}: {_short(failed)}"
        reports = self.comm.gather((problem, files, crcs))
        outcome: Any = None
        if self.comm.rank == 0:
            outcome = self._commit(reports or [])
        outcome = self.comm.broadcast(outcome)
        if isinstance(outcome, tuple):
            raise CheckpointError(f"checkpoint step {self.step} was not saved: {outcome[1]}",
                                  hint=outcome[2] if len(outcome) > 2 else _SPACE_HINT)
        return self.directory / layout.step_dirname(self.step)

    def _write_own(self, own: list[tuple[str, Any]], files: dict[str, int],
                   crcs: dict[str, tuple[str, str]]) -> None:
        assert self.path is not None
        for name, obj in own:
            files[name], crcs[name] = save_file(obj, self.path / name)

    def _commit(self, reports: list[Any]) -> Any:
        """Rank 0: write the marker when every rank succeeded. Retention is not done here
        (the caller runs it after the save returns, see ``Checkpointer``)."""
        assert self.folder is not None and self.path is not None
        problems = [p for p, _, _ in reports if p]
        if problems:
            self.abandon()
            return ("error", "; ".join(problems))
        try:
            files: dict[str, int] = {}
            crcs: dict[str, tuple[str, str]] = {}
            for _, rank_files, rank_crcs in reports:
                files.update(rank_files)
                crcs.update(rank_crcs)
            shard_dir = self.path / sharded.SUBDIR
            if shard_dir.is_dir():  # DCP fsyncs its files but not their folder
                fsync_dir(shard_dir)
                for entry in os.scandir(shard_dir):
                    files[f"{sharded.SUBDIR}/{entry.name}"] = entry.stat().st_size
            fsync_dir(self.path)  # the files' names, before the rename publishes them
            unchecked = sorted(set(files) - set(crcs))
            if unchecked:  # a marker without it would be refused when loading: never commit one
                raise CheckpointError(
                    f"checkpoint step {self.step}: {unchecked[0]} was written without its checksum; "
                    "the save is not committed", hint="report this to the scaletrain developers with "
                    "the folder's file list; the previous checkpoint is intact")
            self.folder.commit(self._marker(files, crcs))
        except CheckpointError as err:
            self.abandon()
            return ("error", err.message, err.hint)
        except BaseException as err:
            self.abandon()
            return ("error", _short(err))
        return "ok"

    def _marker(self, files: dict[str, int], crcs: dict[str, tuple[str, str]]) -> dict[str, Any]:
        import torch

        from scaletrain._version import __version__

        return {
            "format": layout.FORMAT,
            "step": self.step,
            "world_size": self.comm.world_size,
            "strategy": strategy_name(self.entries),
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "scaletrain_version": __version__,
            "torch_version": torch.__version__,
            "objects": {e.name: {"kind": e.kind, "sharded": e.sharded} for e in self.entries},
            "files": dict(sorted(files.items())),
            # every file's checksum, taken while it was written (read by older scaletrains)...
            checksum.ALGORITHM: {k: crcs[k][0] for k in sorted(files)},
            # ...and its blocks', each checked as a load reads it (checkpoint.verified)
            "blocks": {"bytes": checksum.BLOCK_BYTES,
                       checksum.ALGORITHM: {k: crcs[k][1] for k in sorted(files)}},
        }

    def abandon(self) -> None:
        """Remove the partial folder (rank 0) after a failure."""
        if self.folder is not None:
            self.folder.abandon()


class _Background:
    """A function run in a thread; :meth:`join` returns its exception, if any."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True,
                                        name="scaletrain-checkpoint-files")
        self._thread.start()

    def _run(self, fn: Any, args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except BaseException as err:
            self.error = err

    def join(self) -> BaseException | None:
        self._thread.join()
        return self.error


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    line = text[0] if text else ""
    if not line:
        frames = traceback.extract_tb(err.__traceback__)
        line = f"at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(err).__name__}: {line}"[:300]
