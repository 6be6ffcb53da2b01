"""A daemon thread that feeds the Monitor's sinks, so that building records and writing files
stays off the training thread.

The training thread hands over a :class:`~scaletrain.observe.records.StepBatch` of raw
per-step tuples (a list swap and a queue put); this thread converts the losses, formats the
lines and writes. PyTorch releases the GIL inside its operators, so this work can run while the
training thread is in them. Calls reach the sinks in the order they were made; an error in a
sink is kept and raised by :meth:`SinkWriter.close`, so a full disk is reported, not lost.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from scaletrain.observe.records import Record, StepBatch
from scaletrain.observe.sinks import Sink

_STOP = object()


class SinkWriter:
    """Runs the sinks' ``write``/``event``/``close`` in one background thread.

    ``cpu_s`` is the CPU time this thread has spent (what monitoring costs besides the step
    path; ``benchmarks/monitor_overhead.py`` reports it).
    """

    def __init__(self, sinks: list[Sink]) -> None:
        self._sinks = sinks
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self.cpu_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="scaletrain-monitor-writer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._error is not None:
                continue  # after a failure keep draining, so close() does not wait on a full queue
            kind, payload = item
            cpu0 = time.thread_time()
            try:
                for sink in self._sinks:
                    getattr(sink, kind)(payload)
            except Exception as exc:  # noqa: BLE001 - kept and raised in close(), on the caller's thread
                self._error = exc
            self.cpu_s += time.thread_time() - cpu0

    @property
    def error(self) -> BaseException | None:
        """The first error a sink raised, None so far (then nothing more is written)."""
        return self._error

    def write(self, batch: StepBatch) -> None:
        """Queue a batch of buffered steps."""
        self._queue.put(("write", batch))

    def event(self, record: Record) -> None:
        """Queue a finding or note."""
        self._queue.put(("event", record))

    def close(self, summary: Record, *, timeout_s: float = 120.0) -> None:
        """Queue the summary, wait for everything to be written, and stop the thread."""
        self._queue.put(("close", summary))
        self._queue.put(_STOP)
        self._thread.join(timeout=timeout_s)
        if self._error is not None:
            raise self._error
