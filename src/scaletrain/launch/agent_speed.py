"""Slow spots of torch's elastic agent that `scaletrain run` works around in its own process.

Each is worth tens to hundreds of milliseconds of every local launch (issue 23: the launcher at
or under torchrun's wall time), and each changes only how long the agent takes, never what it
does:

- the rendezvous names its log events with ``inspect.stack()``, twice per event, which builds
  every frame's source context (reading source files) to get one function name;
- ``PContext.close`` stops the stdout and stderr log tailers one after the other, and each
  tailer thread finishes its 0.1 s ``time.sleep`` before it sees "finished": up to 0.1 s of
  every exit, after the last worker has ended;
- the first join of a c10d rendezvous waits a random 0-0.3 s so that many nodes do not reach
  the store at once; with one node there is no one to spread out.

Each patch is idempotent and checks that torch still has what it replaces; where it does not,
it leaves torch as it is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from threading import Event
from typing import Any, TextIO

from scaletrain.torch_features import ordered_parameters, tail_logfile_parameters


def cheap_rendezvous_event_names() -> None:
    """Give the rendezvous's ``get_method_name`` a frame lookup instead of ``inspect.stack()``."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    if not callable(getattr(rdzv, "get_method_name", None)) or getattr(rdzv.get_method_name, "_scaletrain", False):
        return

    def get_method_name(depth: int = 2) -> str:
        # inspect.stack()[depth].function, where entry 0 is this function: the same frame
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:
            return "no_method_name"

    get_method_name._scaletrain = True  # type: ignore[attr-defined]
    rdzv.get_method_name = get_method_name


def stop_tailers_together() -> None:
    """Make torch's worker-process context stop its log tailers at once, not one by one.

    ``PContext.close`` ends the workers, then calls ``stop()`` on each of its tailers (stdout,
    stderr) in turn; each ``stop()`` wakes its threads and waits for them, and a thread may be
    in its 0.1 s sleep. One after another that was ~0.2 s of every launch's exit. Here every
    tailer is told "finished" as soon as the workers are ended, so their last sleeps overlap;
    each still reads its file to the end, so no line is lost. Idempotent; a no-op where torch's
    internals differ from what is expected.
    """
    from torch.distributed.elastic.multiprocessing import api

    close = getattr(api.PContext, "close", None)
    if close is None or getattr(close, "_scaletrain_together", False):
        return

    def close_together(self: Any, death_sig: Any = None, timeout: int = 30) -> None:
        tails = _tailers(self)
        events = [e for tail in tails for e in getattr(tail, "_finished_events", {}).values()]
        end_workers = self._close

        def end_then_finish(**kwargs: Any) -> None:
            end_workers(**kwargs)
            for event in events:  # every tailer drains its file and leaves, together
                event.set()

        self._close = end_then_finish  # shadows the method for this one call
        try:
            close(self, death_sig, timeout)
        finally:
            del self._close

    close_together._scaletrain_together = True  # type: ignore[attr-defined]
    api.PContext.close = close_together  # type: ignore[method-assign]


def _tailers(context: Any) -> list[Any]:
    """A worker context's log tailers: a list ``_tail_logs`` from torch 2.10, the two attributes
    ``_stdout_tail`` and ``_stderr_tail`` (either may be None) in 2.6 to 2.9."""
    tails = getattr(context, "_tail_logs", None)
    if tails is None:
        tails = [getattr(context, name, None) for name in ("_stdout_tail", "_stderr_tail")]
    return [tail for tail in tails if tail is not None]


def prompt_tailers() -> None:
    """Make torch's log tailers wait for "finished" on its event, not in ``time.sleep``.

    A tailer (``tail_log.tail_logfile``, one thread per worker and stream) reads its file to
    the end, then sleeps 0.1 s and looks again; only then does it see that the workers are
    done. Here it waits on the "finished" event for the same 0.1 s, so ``TailLog.stop`` wakes
    it at once; it still reads to the end of the file before it leaves (no line is lost), and
    prints the same lines with the same prefixes.
    """
    from torch.distributed.elastic.multiprocessing import tail_log

    original = getattr(tail_log, "tail_logfile", None)
    if not callable(original) or getattr(original, "_scaletrain", False):
        return
    theirs, mine = tail_logfile_parameters(), ordered_parameters(tail_logfile)
    if not theirs or mine[:len(theirs)] != theirs:
        return  # torch's tailer takes what ours does not: ours would not be a drop-in
    tail_log.tail_logfile = tail_logfile  # TailLog.start looks the name up in the module


def tail_logfile(header: str, file: str, dst: TextIO, finished: Event, interval_sec: float,
                 log_line_filter: Callable[[str], bool] | None = None) -> None:
    """torch's ``tail_logfile`` (same arguments, same prefixes), woken by ``finished``, and
    byte for byte: torch reads the file as text, so a ``\\r`` became a line of its own and bytes
    that are not UTF-8 were replaced. Here lines end at ``\\n`` only, their bytes are copied as
    written, and a line written in pieces gets its prefix once, at its start."""
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


@contextmanager
def no_first_join_skew(one_node: bool) -> Iterator[None]:
    """Within the block, a c10d rendezvous of ``one_node`` joins without its random pause.

    torch's ``DynamicRendezvousHandler.next_rendezvous`` calls ``_delay(seconds=(0, 0.3))``
    before its first join "to slightly skew the rendezvous attempts across the nodes"; a run
    of one node has a single agent, and the pause (0.15 s on average) is all wait. Its other
    delays (a fixed second between polls of a rendezvous still forming) are kept.
    """
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    delay = getattr(rdzv, "_delay", None)
    if not one_node or not callable(delay):
        yield
        return

    def no_random_delay(seconds: float | tuple[float, float]) -> None:
        if not isinstance(seconds, tuple):  # a (low, high) range is the first join's skew
            delay(seconds)

    rdzv._delay = no_random_delay
    try:
        yield
    finally:
        rdzv._delay = delay
