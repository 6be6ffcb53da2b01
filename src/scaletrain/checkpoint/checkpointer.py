"""``scaletrain.Checkpointer``: save, resume, stop on time limits, export weights.

::

    ckpt = scaletrain.Checkpointer("checkpoints", keep=3, every_steps=500)
    state = {"model": model, "optimizer": opt, "scheduler": sched, "loader": train}
    start = ckpt.load_latest(state) or 0
    for step in range(start, total_steps):
        train_one_step()
        ckpt.step(step + 1, state)     # saves when due; stops the job cleanly on a signal
    ckpt.close()
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from scaletrain.checkpoint import layout, stepfolder
from scaletrain.checkpoint.collect import classify
from scaletrain.checkpoint.comm import Comm
from scaletrain.checkpoint.errors import CheckpointError
from scaletrain.checkpoint.safeio import gc_paused
from scaletrain.checkpoint.staging import Stager
from scaletrain import settings
from scaletrain.errors import UsageError
from scaletrain.settings import Spec

_MINUTES_DUE = 1  # StopAgreement flag bit 0: "every_minutes is due" on some rank


# The Checkpointer's options, each declared once (scaletrain.settings): what it means, its unit,
# its check. Checked where they enter, in __init__; a refusal names the keyword the caller typed.
OPTIONS: dict[str, Spec] = {
    "directory": Spec(doc="the folder of the step-N checkpoint folders, e.g. Checkpointer('checkpoints')",
                      check=settings.path(shape="a folder path (str or pathlib.Path) without a NUL")),
    "keep": Spec(doc="how many committed checkpoints to keep, e.g. keep=3", check=settings.count()),
    "every_steps": Spec(doc="save when step % every_steps == 0, e.g. every_steps=500",
                        check=settings.count(high=10**12), optional=True),
    "every_minutes": Spec(doc="save when this much wall time passed, e.g. every_minutes=30",
                          check=settings.number(above=0, high=10**6), unit="minutes", optional=True),
    "async_save": Spec(doc="write in the background while training goes on", check=settings.boolean()),
    "exit_on_stop": Spec(doc="raise SystemExit(75) after the save on an agreed stop", check=settings.boolean()),
    "strict": Spec(doc="a damaged newest checkpoint raises instead of falling back", check=settings.boolean()),
}
# save()'s step, declared as the options are: "save(): step must be a whole number from 0 ..."
STEP = Spec(doc="pass the number of optimizer steps done, e.g. save(1200, state)",
            check=settings.count(low=0, high=10**12))
# close()'s and export()'s arguments (step() takes save()'s step; the state and the model are
# checked where they are read, by collect.classify and export.export)
ENDED_NORMALLY = Spec(doc="False when the run stopped on an error", check=settings.boolean())
EXPORT_PATH = Spec(doc="the file to write, e.g. export('model.pt', model)", check=settings.path())


def _option(name: str, value: Any) -> Any:
    return settings.check_value(OPTIONS[name], value, f"Checkpointer: {name}")


class Checkpointer:
    """Checkpoints in ``directory``, one folder per step, the newest ``keep`` kept.

    Args:
        directory: where the ``step-NNNNNNNN/`` folders go (created; must be writable and,
            for several nodes, on a file system every node sees).
        keep: how many committed checkpoints to keep (the newest ones; >= 1).
        every_steps: ``step()`` saves when ``step % every_steps == 0``.
        every_minutes: ``step()`` saves when this much wall time passed since the last save;
            agreed across ranks, so every rank saves the same step.
        async_save: ``save()`` returns once the state is copied to CPU memory; the files are
            written in the background while training goes on. At most one save is in flight
            (the next waits); an error of the background write is raised by the next call.
            State on a GPU is copied into pinned host memory that is kept for the next save
            (:mod:`scaletrain.checkpoint.staging`): host memory the size of this rank's state,
            until ``close()``. A blocking save stages the replicated state (rank 0's
            ``replicated.pt``) of a GPU the same way before writing it, so that write runs at
            the disk's speed: host memory the size of that state on rank 0, until ``close()``.
        exit_on_stop: on an agreed stop (time limit, preemption), ``step()`` saves and raises
            ``SystemExit(75)`` (``contract.environ.EXIT_STOPPED``); with False it returns True and
            ``should_stop()`` is True from then on.
        strict: a damaged newest checkpoint (a file missing, truncated, or with another
            checksum than when it was written) raises CheckpointError in ``load_latest``.
            Without it (the default) the load falls back to the newest intact checkpoint,
            warns naming the damaged one and keeps it as ``damaged-step-N-*`` for inspection.
    """

    def __init__(self, directory: str | Path, keep: int = 3, every_steps: int | None = None,
                 every_minutes: float | None = None, async_save: bool = False, *,
                 exit_on_stop: bool = True, strict: bool = False) -> None:
        self.directory = Path(_option("directory", directory)).expanduser().absolute()
        self.keep: int = _option("keep", keep)
        self.every_steps: int | None = _option("every_steps", every_steps)
        self.every_minutes: float | None = _option("every_minutes", every_minutes)
        self.async_save: bool = _option("async_save", async_save)
        # async: every save's copy off the device; blocking: the replicated payload's GPU
        # tensors before torch.save (pinned buffers either way, kept from save to save)
        self._stager: Stager | None = Stager()
        self.exit_on_stop: bool = _option("exit_on_stop", exit_on_stop)
        self.strict: bool = _option("strict", strict)
        stepfolder.check_directory(self.directory)
        self._comm: Comm | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._retention: threading.Thread | None = None
        # Listening from now on: a stop signal between here and the first step() is recorded and
        # acted on there (saved, exit 75), not left to the default action that would kill the program
        from scaletrain.runtime import agreement

        self._agreement: Any = agreement.StopAgreement()
        self._last_saved: int | None = None
        self._last_save_time = time.monotonic()
        self._stop_reason: str | None = None
        self._closed = False
        self._calls = 0  # step() calls so far
        self._last_step: int | None = None   # the step of the latest step() call
        self._save_call = -1  # the step() call during which the last save started

    # -- saving ----------------------------------------------------------------------
    def save(self, step: int, state: MutableMapping[str, Any]) -> None:
        """Save ``state`` as checkpoint ``step`` (a collective: call it on every rank).

        Returns when the checkpoint is committed, or with ``async_save`` once the state is
        copied and the background write has started.
        """
        step = settings.check_value(STEP, step, "save(): step")
        self._check_open()
        self.wait()
        from scaletrain.checkpoint.writer import SaveJob

        entries = classify(state)
        job = SaveJob(self.directory, step, entries, self._get_comm(), keep=self.keep,
                      stager=self._stager if self.async_save else None,
                      pinned=None if self.async_save else self._stager)
        # the training thread waits for these parts: no full collection of its objects meanwhile
        # (the background half of an async save runs with the collector as the program has it)
        with gc_paused():
            job.prepare()
            self._save_call = self._calls
            self._last_saved = step
            self._last_save_time = time.monotonic()
            if not self.async_save:
                job.run()
        if not self.async_save:
            self._retire(step)
            return
        self._thread = threading.Thread(target=self._background, args=(job,),
                                        name=f"scaletrain-checkpoint-{step}", daemon=True)
        self._thread.start()

    def _background(self, job: Any) -> None:
        try:
            job.run()
        except BaseException as err:  # kept for the next call in the training thread
            self._error = err
            return
        self._retire(job.step)

    def _retire(self, step: int) -> None:
        """Rank 0, after ``step`` is committed: delete the checkpoints beyond ``keep`` in a
        thread of its own, off the save's path (joined by the next save, load or close)."""
        if self._get_comm().rank != 0:
            return
        self._retention = threading.Thread(target=_retention, name="scaletrain-retention",
                                           args=(self.directory, self.keep, step), daemon=True)
        self._retention.start()

    def wait(self) -> None:
        """Wait for a save in flight; raise its error if it failed (never lost)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        retention, self._retention = self._retention, None
        if retention is not None:
            retention.join()
        err, self._error = self._error, None
        if err is not None:
            if isinstance(err, CheckpointError):
                raise err
            raise CheckpointError(f"the background checkpoint save failed: {err}",
                                  hint="the previous checkpoint is intact; check free space "
                                       "and quota") from err

    def close(self, *, ended_normally: bool = True) -> None:
        """Finish a save in flight and release the checkpointer's resources (all ranks).

        A run that ends without a stop, past the step of an earlier run's ``stop.json``, marks
        that record superseded (rank 0): the folder then no longer reads as stopped.
        """
        settings.check_value(ENDED_NORMALLY, ended_normally, "close(): ended_normally")
        if self._closed:
            return
        try:
            self.wait()
            if ended_normally and self._stop_reason is None and self._last_step is not None \
                    and self._comm is not None and self._comm.rank == 0:
                from scaletrain.checkpoint.stoprecord import mark_superseded

                mark_superseded(self.directory, step=self._last_step)
        finally:
            self._closed = True
            if self._agreement is not None:
                self._agreement.close()
                self._agreement = None
            if self._stager is not None:
                self._stager.close()
            if self._comm is not None:
                self._comm.close()
                self._comm = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(ended_normally=exc[0] is None)

    # -- loading ---------------------------------------------------------------------
    def load_latest(self, state: MutableMapping[str, Any]) -> int | None:
        """Load the newest committed checkpoint into ``state``; its step, or None (fresh run).

        Objects are loaded in place (``load_state_dict``); plain values are replaced in the
        ``state`` mapping. Each rank reads onto its own device. Raises CheckpointError for a
        damaged or unsafe checkpoint (it names the step and the file).

        Same number of processes as the save: everything comes back, each rank's RNG states
        included, so training continues bit for bit. Another number: sharded state is
        resharded (DCP), replicated state loads as is, the training loader continues the
        epoch's remaining samples over the new ranks, and RNG states are not restored (rank 0
        warns; each rank keeps the seeds the script set).
        """
        self._check_open()
        self.wait()
        from scaletrain.checkpoint import reader

        entries = classify(state)
        comm = self._get_comm()
        step = reader.load(self.directory, entries, state, comm, _device(entries),
                           strict=self.strict)
        if comm.rank == 0:
            # damage is warned by the reader as it passes over it; a step gone back is the rule's
            for note in layout.choose(self.directory, verify_bytes=0).backwards_notes():   # just loaded: no reread
                warnings.warn(note, stacklevel=2)
        if step is not None:
            self._last_saved = step
        self._last_save_time = time.monotonic()
        return step

    @property
    def latest_step(self) -> int | None:
        """The step a resume loads (:func:`layout.choose`, no collective), or None."""
        return layout.choose(self.directory).step

    # -- the loop helper ---------------------------------------------------------------
    def step(self, step: int, state: MutableMapping[str, Any]) -> bool:
        """Call after every optimizer step, on every rank: saves when due, stops when asked.

        Due: ``step % every_steps == 0``, or ``every_minutes`` passed (agreed across ranks
        one step late, so all ranks save the same step). On an agreed stop (a time-limit or
        preemption signal on any rank, see ``scaletrain.runtime.preempt``): saves ``step``
        unless it is already saved, waits for the write, writes ``stop.json`` and raises
        ``SystemExit(75)``; with ``exit_on_stop=False`` returns True instead.
        """
        from scaletrain.runtime import agreement

        step = settings.check_value(STEP, step, "step(): step")
        self._check_open()
        if self._agreement is None:
            self._agreement = agreement.StopAgreement()
        self._calls += 1
        self._last_step = step
        minutes_due = (self.every_minutes is not None and
                       time.monotonic() - self._last_save_time >= self.every_minutes * 60)
        reason, flags = self._agreement.poll(_MINUTES_DUE if minutes_due else 0)
        if reason is not None:
            return self._stop(step, state, reason)
        # The flag read now was raised at the previous call; a save during that call (after
        # its poll) already served it. Every rank saved at that same call, so all agree.
        minutes_agreed = bool(flags & _MINUTES_DUE) and self._save_call < self._calls - 1
        due = (self.every_steps is not None and step % self.every_steps == 0) or minutes_agreed
        if due and self._last_saved != step:
            self.save(step, state)
        return False

    def _stop(self, step: int, state: MutableMapping[str, Any], reason: str) -> bool:
        from scaletrain.checkpoint.stoprecord import write_stop_record
        from scaletrain.contract.environ import EXIT_STOPPED

        if self._last_saved != step:
            self.save(step, state)
        self.wait()
        self._stop_reason = reason
        if self._get_comm().rank == 0:
            write_stop_record(self.directory, reason=reason, step=step)
        if self.exit_on_stop:
            self.close()
            raise SystemExit(EXIT_STOPPED)
        return True

    def should_stop(self) -> bool:
        """True once ``step()`` stopped on an agreed time limit or preemption."""
        return self._stop_reason is not None

    # -- export ------------------------------------------------------------------------
    def export(self, path: str | Path, model: Any) -> Path | None:
        """Write ``model``'s consolidated weights to one file for inference (all ranks call).

        See :func:`scaletrain.checkpoint.export.export`.
        """
        settings.check_value(EXPORT_PATH, path, "export(): path")
        self.wait()
        from scaletrain.checkpoint.export import export

        return export(path, model)

    # -- internals ---------------------------------------------------------------------
    def _get_comm(self) -> Comm:
        if self._comm is None:
            self._comm = Comm()
        return self._comm

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("this Checkpointer is closed",
                             hint="create a new Checkpointer to save or load again")
        if self._error is not None or (self._thread is not None and not self._thread.is_alive()):
            self.wait()  # surfaces a background failure at the next call

    def __del__(self) -> None:
        for name in ("_thread", "_retention"):
            thread = getattr(self, name, None)
            if thread is not None and thread.is_alive() and not sys.is_finalizing():
                thread.join()


def _retention(directory: Path, keep: int, step: int) -> None:
    """Delete committed checkpoints beyond the newest ``keep`` (never ``step``). A failure
    only leaves an old folder behind, so it is a warning, not a failed save."""
    try:
        stepfolder.apply_retention(directory, keep, protect={step})
    except OSError as err:
        warnings.warn(f"could not delete old checkpoints in {directory}: {err}; they stay "
                      "on disk", stacklevel=1)


def _device(entries: list[Any]) -> Any:
    """Where this rank's tensors live: the device ``setup()`` chose, else CUDA's current."""
    from scaletrain.parallel.precision import state_of

    for entry in entries:
        ps = state_of(entry.obj)
        if ps is not None:
            return ps.env.device
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"
