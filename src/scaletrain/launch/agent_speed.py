"""Two slow spots of torch's elastic agent that `scaletrain run` works around in its own process.

Both are worth a few hundred milliseconds of every local launch (issue 23: the launcher at or
under torchrun's wall time), and both change only how long the agent takes, never what it does:

- the rendezvous names its log events with ``inspect.stack()``, twice per event, which builds
  every frame's source context (reading source files) to get one function name;
- ``PContext.close`` stops the stdout and stderr log tailers one after the other, each waiting
  out its 0.1 s poll.

Each patch is idempotent and checks that torch still has what it replaces; where it does not,
it leaves torch as it is.
"""

from __future__ import annotations

import sys
from typing import Any


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
        tails = list(getattr(self, "_tail_logs", ()))
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


