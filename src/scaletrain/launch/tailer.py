"""The launcher's copy of torch's log tailer (``tail_log.tail_logfile``), which
:func:`scaletrain.launch.patches.prompt_tailers` puts in its place: woken by "finished"
instead of sleeping, and byte for byte. Its own module so that the adapter
(:mod:`scaletrain.launch.adapter`) can compare its arguments with torch's."""

from __future__ import annotations

import os
from collections.abc import Callable
from threading import Event
from typing import TextIO


def tail_logfile(header: str, file: str, dst: TextIO, finished: Event, interval_sec: float,
                 log_line_filter: Callable[[str], bool] | None = None) -> None:
    """torch's ``tail_logfile`` (same arguments, same prefixes), woken by ``finished``, and
    byte for byte: torch reads the file as text, so a ``\\r`` became a line of its own and bytes
    that are not UTF-8 were replaced. Here lines end at ``\\n`` only, their bytes are copied as
    written, and a line written in pieces gets its prefix once, at its start; a last line
    without its ``\\n`` gets one on the console (torch's print gave it one too)."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        finished.wait(interval_sec)
    out = _ByteSink(dst)
    at_start, keep = True, True
    with open(file, "rb") as fp:
        while True:
            piece = fp.readline(_PIECE)
            if piece:
                if at_start:   # the filter judges a line by its start, once
                    keep = log_line_filter is None or \
                        log_line_filter(piece.decode("utf-8", errors="replace"))
                if keep:
                    out.write(header if at_start else "", piece)
                at_start = piece.endswith(b"\n")
            elif finished.is_set():  # at the end of the file, and the worker is done
                if not at_start and keep:   # its last line had no end: end it here, or the
                    out.write("", b"\n")     # next rank's prefix would continue it
                break
            else:
                finished.wait(interval_sec)


_PIECE = 1 << 16  # a line longer than this is copied in pieces (bounded memory)


class _ByteSink:
    """Writes a prefix and raw bytes to a text stream's byte buffer (a stream without one, such
    as a StringIO, gets the bytes decoded)."""

    def __init__(self, dst: TextIO) -> None:
        self.dst = dst
        self.raw = getattr(dst, "buffer", None)

    def write(self, prefix: str, data: bytes) -> None:
        if self.raw is None:
            self.dst.write(prefix + data.decode("utf-8", errors="replace"))
            return
        self.dst.flush()   # whatever went through the text layer first stays first
        self.raw.write(prefix.encode("utf-8") + data)
        self.raw.flush()


tail_logfile._scaletrain = True  # type: ignore[attr-defined]
