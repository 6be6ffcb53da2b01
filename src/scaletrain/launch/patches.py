"""Every patch `scaletrain run` makes to torch's internals (and the one CPython private it
calls), in one place, each beside the feature test that guards it.

The launcher's own process only. Each patch here changes how long the agent takes or which
signals it handles, never what it does; each asks :mod:`scaletrain.torch_features` whether
torch still has what it replaces and, where it does not, leaves torch as it is. Inside the
workers, patching torch *is* the feature (``--cpu``, the bounded rendezvous, the group
records), so those patches stay with their features in :mod:`scaletrain.launch.inproc`; every
one of them is installed in one place, ``inproc.worker_shim.activate``, when the program
imports the torch module it patches: ``rendezvous.patch_c10d``/``patch_multiprocessing``,
``group_record.patch_c10d``/``patch_optimizer``, ``cpu_smoke.patch_torch``/``patch_c10d``/
``patch_device_mesh`` (with ``cpu_cuda`` and ``cpu_map`` under them), and at start-up
``cpu_smoke.clip_affinity`` (``os.sched_setaffinity``) and ``install_cuda_missing_hook``
(``sys.excepthook``).

=============================================  ==========================================================
patch (what it replaces)                       guard (scaletrain.torch_features)
=============================================  ==========================================================
:func:`cheap_rendezvous_event_names`           ``rendezvous_names_events()``
(``dynamic_rendezvous.get_method_name``)
:func:`stop_tailers_together`                  ``pcontext_closes()``
(``PContext.close``)
:func:`prompt_tailers`                         ``tail_logfile_parameters()`` a prefix of ours
(``tail_log.tail_logfile``)
:func:`no_first_join_skew`                     ``rendezvous_skews_first_join()``
(``dynamic_rendezvous._delay``, one block)
:func:`torch_leaves_forwarded_signals`         ``launch_config_fields()``, ``agent_reads_signals_env()``,
(``api._terminate_process_handler``)           ``agent_terminate_handler()``
:func:`agent_hooks` (``LocalElasticAgent``,    ``agent_monitors_workers()``, ``subprocess_context_closes()``
``SubprocessContext._close``, one block)
=============================================  ==========================================================

Not patches, kept with their owners: ``lean.leave`` calls CPython's ``threading._shutdown``
and ``atexit._run_exitfuncs`` where they exist (else a plain ``sys.exit``), and ``local._config``
passes only the ``LaunchConfig`` fields torch has.

Speed (issue 23: the launcher at or under torchrun's wall time); each is worth tens to
hundreds of milliseconds of every local launch:

- the rendezvous names its log events with ``inspect.stack()``, twice per event, which builds
  every frame's source context (reading source files) to get one function name;
- ``PContext.close`` stops the stdout and stderr log tailers one after the other, and each
  tailer thread finishes its 0.1 s ``time.sleep`` before it sees "finished": up to 0.1 s of
  every exit, after the last worker has ended;
- the first join of a c10d rendezvous waits a random 0-0.3 s so that many nodes do not reach
  the store at once; with one node there is no one to spread out.

Behaviour: the agent leaves the signals the launcher forwards to it (:mod:`.signals`), and
runs the launcher's restart policy and hang forensics (:mod:`.supervise`). Each patch is
idempotent, or undone when its block ends.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from threading import Event
from typing import Any, TextIO

from scaletrain.launch.signals import FORWARDED, TORCH_SIGNALS
from scaletrain.torch_features import (SIGNALS_ENV, agent_monitors_workers, agent_reads_signals_env,
                                       agent_terminate_handler, launch_config_fields,
                                       ordered_parameters, pcontext_closes, rendezvous_names_events,
                                       rendezvous_skews_first_join, subprocess_context_closes,
                                       tail_logfile_parameters)


def cheap_rendezvous_event_names() -> None:
    """Give the rendezvous's ``get_method_name`` a frame lookup instead of ``inspect.stack()``."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    if not rendezvous_names_events() or getattr(rdzv.get_method_name, "_scaletrain", False):
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

    if not pcontext_closes() or getattr(api.PContext.close, "_scaletrain_together", False):
        return
    close = api.PContext.close

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

    if not one_node or not rendezvous_skews_first_join():
        yield
        return
    delay = rdzv._delay

    def no_random_delay(seconds: float | tuple[float, float]) -> None:
        if not isinstance(seconds, tuple):  # a (low, high) range is the first join's skew
            delay(seconds)

    rdzv._delay = no_random_delay
    try:
        yield
    finally:
        rdzv._delay = delay


@contextmanager
def torch_leaves_forwarded_signals() -> Iterator[None]:
    """Within the block, torch's agent handles only :data:`~.signals.TORCH_SIGNALS`, on every torch.

    A torch whose LaunchConfig has ``signals_to_handle`` is told by ``local._config``. One whose
    agent reads the list from ``TORCHELASTIC_SIGNALS_TO_HANDLE`` only is told that way. An older
    one (2.6 to 2.9) installs its stop-now handler for SIGTERM too when the workers start, which
    would end them without a chance to save: there, its handler passes the signals we forward to
    the handler that was in place when the block began (``signals.forward_stop_signals``'s).
    Where even that handler cannot be found, torch is left as it is: a SIGTERM then stops the
    workers at once, as torchrun would. Enter after ``forward_stop_signals``, in the main thread.
    """
    if "signals_to_handle" in launch_config_fields():
        yield
        return
    if agent_reads_signals_env():
        saved = os.environ.get(SIGNALS_ENV)
        os.environ[SIGNALS_ENV] = TORCH_SIGNALS
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop(SIGNALS_ENV, None)
            else:
                os.environ[SIGNALS_ENV] = saved
        return
    ours = {s: h for s in FORWARDED if callable(h := signal.getsignal(s))}
    if not agent_terminate_handler() or not ours:
        yield
        return
    from torch.distributed.elastic.multiprocessing import api

    torchs = api._terminate_process_handler

    def handler(signum: int, frame: Any) -> None:
        mine = ours.get(signal.Signals(signum))
        (mine if mine is not None else torchs)(signum, frame)

    api._terminate_process_handler = handler  # PContext.start looks the name up when it runs
    try:
        yield
    finally:
        api._terminate_process_handler = torchs


@contextmanager
def agent_hooks(after_monitor: Callable[[Any, Any], None],
                before_close: Callable[[Any], None]) -> Iterator[None]:
    """Within the block, ``elastic_launch`` builds an agent that hands each result of its
    ``_monitor_workers`` to ``after_monitor(agent, result)``, and the worker process context
    calls ``before_close(context)`` before it stops its workers (each where torch has the
    method; what they decide is :mod:`.supervise`'s)."""
    import torch.distributed.elastic.multiprocessing.api as mp_api
    import torch.distributed.launcher.api as api

    base = api.LocalElasticAgent
    base_close = mp_api.SubprocessContext._close if subprocess_context_closes() else None

    def _close(ctx, *args, **kwargs):  # type: ignore[no-untyped-def]
        before_close(ctx)
        return base_close(ctx, *args, **kwargs)  # type: ignore[misc]

    class _Agent(base):  # type: ignore[misc, valid-type]
        def _monitor_workers(self, worker_group: Any) -> Any:
            result = super()._monitor_workers(worker_group)
            after_monitor(self, result)
            return result

    monitors = agent_monitors_workers()
    if monitors:
        setattr(api, "LocalElasticAgent", _Agent)
    if base_close is not None:
        setattr(mp_api.SubprocessContext, "_close", _close)
    try:
        yield
    finally:
        if monitors:
            setattr(api, "LocalElasticAgent", base)
        if base_close is not None:
            setattr(mp_api.SubprocessContext, "_close", base_close)
