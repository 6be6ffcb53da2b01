"""The launcher's copy of torch's log tailer (``tail_log.tail_logfile``), which
:func:`scaletrain.launch.patches.prompt_tailers` puts in its place: woken by "finished"
instead of sleeping, and byte for byte. Its own module so that the adapter
(:mod:`scaletrain.launch.adapter`) can compare its arguments with torch's."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from threading import Event
from typing import TextIO


def tail_logfile(header: str, file: str, dst: TextIO, finished: Event, interval_sec: float,
                 log_line_filter: Callable[[str], bool] | None = None) -> None:
    """torch's ``tail_logfile`` (same arguments, same prefixes), woken by ``finished``, and
    byte for byte: torch reads the file as text, so bytes that are not UTF-8 were replaced.
    Here a line ends at ``\\n``, or at a ``\\r`` that is not part of ``\\r\\n`` (a progress bar's
    redraw: each state of the bar becomes a line of the log, not one line of every state); its
    bytes are copied as written, a line written in pieces gets its prefix once, at its start,
    and torch's own ``[rankN]:`` (its exception hook's, after ``init_process_group``) is left
    out where it names the rank of ``header``, so a line reads ``[rank 0] Traceback``; a last
    line without its ``\\n`` gets one on the console (torch's print gave it one too)."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        finished.wait(interval_sec)
    lines = _Lines(_ByteSink(dst), header, log_line_filter)
    with open(file, "rb") as fp:
        while True:
            piece = fp.readline(_PIECE)
            if piece:
                lines.feed(piece)
            elif finished.is_set():  # at the end of the file, and the worker is done
                lines.close()
                break
            else:
                finished.wait(interval_sec)


_LONE_CR = re.compile(rb"\r(?!\n)")
_HEADER_RANK = re.compile(r"\[rank (\d+)\]")


class _Lines:
    """Cuts the bytes of one worker's stream into prefixed lines (see :func:`tail_logfile`)."""

    def __init__(self, out: "_ByteSink", header: str,
                 log_line_filter: Callable[[str], bool] | None) -> None:
        self.out, self.header, self.filter = out, header, log_line_filter
        rank = _HEADER_RANK.search(header)
        # torch's own prefix of the same rank, which ours makes a repetition
        self.torchs = re.compile(rb"\[rank" + rank.group(1).encode() + rb"\]: ?") if rank else None
        self.at_start, self.keep, self.pending_cr = True, True, False

    def feed(self, data: bytes) -> None:
        """Copy ``data`` (what one read returned: up to and including a ``\\n``, or less)."""
        if self.pending_cr:   # the last read ended at a "\r": a line's end unless "\n" follows
            data, self.pending_cr = b"\r" + data, False
        if data.endswith(b"\r"):
            data, self.pending_cr = data[:-1], True
        parts = _LONE_CR.split(data)
        for part in parts[:-1]:
            self._segment(part, cut=True)
        self._segment(parts[-1], cut=False)

    def close(self) -> None:
        """The stream ended: a last ``\\r`` ends its line, and so does the end itself (a last line
        without its ``\\n`` gets one, or the next rank's prefix would continue it)."""
        self.pending_cr = False
        self._segment(b"", cut=True)

    def _segment(self, part: bytes, *, cut: bool) -> None:
        if part:
            if self.at_start:
                if self.torchs is not None:
                    part = self.torchs.sub(b"", part, count=1) if self.torchs.match(part) else part
                # the filter judges a line by its start, once
                self.keep = self.filter is None or self.filter(part.decode("utf-8", errors="replace"))
            if self.keep:
                self.out.write(self.header if self.at_start else "", part)
            self.at_start = part.endswith(b"\n")
        if cut and not self.at_start:   # a "\r" ended the line: the log gets it as a line
            if self.keep:
                self.out.write("", b"\n")
            self.at_start = True


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
