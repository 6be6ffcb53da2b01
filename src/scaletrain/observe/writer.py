"""A daemon thread that feeds the Monitor's sinks, so that building records and writing files
stays off the training thread.

The training thread hands over the raw per-step tuples (a list swap and a queue put); this
thread turns them into records, converts losses, encodes JSON and writes. PyTorch releases the
GIL inside its operators, so this work mostly runs while the training thread is in them. Calls
reach the sinks in the order they were made; an error in a sink is kept and raised by
:meth:`SinkWriter.close`, so a full disk is reported, not lost.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from scaletrain.observe.sinks import Record, Sink

_STOP = object()


class SinkWriter:
    """Runs ``build`` and the sinks' ``write``/``event``/``close`` in one background thread."""

    def __init__(self, sinks: list[Sink], build: Callable[[list[Any], float], list[Record]]) -> None:
        self._sinks = sinks
        self._build = build
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="scaletrain-monitor-writer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._error is not None:
                continue  # after a failure keep draining, so close() does not wait on a full queue
            kind, payload, extra = item
            try:
                if kind == "records":
                    records = self._build(payload, extra)
                    for sink in self._sinks:
                        sink.write(records)
                elif kind == "event":
                    for sink in self._sinks:
                        sink.event(payload)
                elif kind == "close":
                    for sink in self._sinks:
                        sink.close(payload)
            except Exception as exc:  # noqa: BLE001 - kept and raised in close(), on the caller's thread
                self._error = exc

    def records(self, steps: list[Any], mem_gb: float) -> None:
        """Queue buffered steps (the raw tuples) with the peak memory read at the flush."""
        self._queue.put(("records", steps, mem_gb))

    def event(self, record: Record) -> None:
        """Queue a finding or note."""
        self._queue.put(("event", record, None))

    def close(self, summary: Record, *, timeout_s: float = 120.0) -> None:
        """Queue the summary, wait for everything to be written, and stop the thread."""
        self._queue.put(("close", summary, None))
        self._queue.put(_STOP)
        self._thread.join(timeout=timeout_s)
        if self._error is not None:
            raise self._error
