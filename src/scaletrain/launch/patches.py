"""Every patch `scaletrain run` makes to torch's internals, in one place.

The launcher's own process only. Some patches here change how long the agent takes; others
(the output copying, the signals the agent handles, the restart policy) change what it does.
Inside the workers, patching torch *is* the feature (``--cpu``, the bounded rendezvous, the group
records), so those patches stay with their features in :mod:`scaletrain.launch.inproc`; every
one of them is installed in one place, ``inproc.worker_shim.activate``, when the program
imports the torch module it patches: ``rendezvous.patch_c10d``/``patch_multiprocessing``,
``group_record.patch_c10d``/``patch_optimizer``, ``cpu_smoke.patch_torch``/``patch_c10d``/
``patch_device_mesh`` (with ``cpu_cuda`` and ``cpu_map`` under them), and at start-up
``cpu_smoke.clip_affinity`` (``os.sched_setaffinity``) and ``install_cuda_missing_hook``
(``sys.excepthook``).

Every private name these patches need is listed and looked up once, when a launch starts, by
:mod:`scaletrain.launch.adapter`, which also decides which patches a launch makes
(:func:`install_lasting`, :func:`scoped_patches`, :func:`agent_hooks`): a patch here assumes
its names are there. ``lean.leave`` calls CPython's ``threading._shutdown`` and
``atexit._run_exitfuncs`` through :mod:`scaletrain.torch_features`, and ``local._config``
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

``SCALETRAIN_TORCH_AS_IS=1`` (the adapter's ``as_is``) turns every one of them off, in every
launch: the lasting patches an earlier launch of the same process installed are put back to
torch's own functions (:func:`install_lasting`), the scoped ones and the agent's hooks are not
entered, the launcher's exit tears torch down as Python does (:mod:`.lean`), and the workers
keep their groups' timeouts (``runtime.timeouts``).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from scaletrain.launch.adapter import (EVENT_NAMES, FIRST_JOIN, OUTPUT, REMAINING_RESTARTS,
                                      RESTART_COUNT, RESTARTS, SIGNALS, TAILERS_TOGETHER, Adapter,
                                      Patch, off_at_use, restart_count)
from scaletrain.launch.signals import FORWARDED, TORCH_SIGNALS
from scaletrain.launch.tailer import tail_logfile
from scaletrain.torch_features import SIGNALS_ENV, agent_reads_signals_env, launch_config_fields


def install_lasting(adapter: Adapter) -> None:
    """The patches that stay for the process, as ``adapter`` decides: each installed
    (idempotent) where it found every name the patch needs, and put back to torch's own where
    it did not or where torch runs as it is, so that an earlier launch's patches do not stay."""
    for patch, install, module, owner, name in _LASTING:
        if patch in adapter:
            install()
            continue
        try:
            found = importlib.import_module(module)
        except ImportError:  # a module torch moved: nothing of ours is in it
            continue
        _put_back(getattr(found, owner) if owner else found, name)


def _ours(function: Any) -> bool:
    return bool(getattr(function, "_scaletrain", False))


def _replace(owner: Any, name: str, ours: Any) -> None:
    """Put ``ours`` (marked ``_scaletrain``) in place of ``owner.name``, keeping torch's own
    beside it (``_scaletrain_original_<name>``, on torch's module or class, which lives as long
    as the patch) for :func:`_put_back`."""
    current = getattr(owner, name)
    if not _ours(current):
        setattr(owner, f"_scaletrain_original_{name}", current)
    setattr(owner, name, ours)


def _put_back(owner: Any, name: str) -> None:
    """Give ``owner.name`` back torch's own function, where one of ours is in its place."""
    original = getattr(owner, f"_scaletrain_original_{name}", None)
    if original is not None and _ours(getattr(owner, name, None)):
        setattr(owner, name, original)


@contextmanager
def scoped_patches(adapter: Adapter, *, one_node: bool) -> Iterator[None]:
    """The patches undone when the launch ends, where ``adapter`` found their names. Enter
    after ``forward_stop_signals``, in the main thread."""
    with ExitStack() as stack:
        if SIGNALS in adapter:
            stack.enter_context(torch_leaves_forwarded_signals())
        if FIRST_JOIN in adapter:
            stack.enter_context(no_first_join_skew(one_node))
        yield


def cheap_rendezvous_event_names() -> None:
    """Give the rendezvous's ``get_method_name`` a frame lookup instead of ``inspect.stack()``."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    if _ours(rdzv.get_method_name):
        return

    def get_method_name(depth: int = 2) -> str:
        # inspect.stack()[depth].function, where entry 0 is this function: the same frame
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:
            return "no_method_name"

    get_method_name._scaletrain = True  # type: ignore[attr-defined]
    _replace(rdzv, "get_method_name", get_method_name)


def stop_tailers_together() -> None:
    """Make torch's worker-process context stop its log tailers at once, not one by one.

    ``PContext.close`` ends the workers, then calls ``stop()`` on each of its tailers (stdout,
    stderr) in turn; each ``stop()`` wakes its threads and waits for them, and a thread may be
    in its 0.1 s sleep. One after another that was ~0.2 s of every launch's exit. Here every
    tailer is told "finished" as soon as the workers are ended, so their last sleeps overlap;
    each still reads its file to the end, so no line is lost. Idempotent.
    """
    from torch.distributed.elastic.multiprocessing import api

    if getattr(api.PContext.close, "_scaletrain_together", False):
        return
    close = api.PContext.close

    def close_together(self: Any, death_sig: Any = None, timeout: int = 30) -> None:
        tails = _tailers(self)
        events = [e for tail in tails for e in getattr(tail, "_finished_events", {}).values()]
        end_workers = self._close

        def end_then_finish(*args: Any, **kwargs: Any) -> None:
            end_workers(*args, **kwargs)
            for event in events:  # every tailer drains its file and leaves, together
                event.set()

        self._close = end_then_finish  # shadows the method for this one call
        try:
            close(self, death_sig, timeout)
        finally:
            del self._close

    close_together._scaletrain_together = True  # type: ignore[attr-defined]
    close_together._scaletrain = True  # type: ignore[attr-defined]
    _replace(api.PContext, "close", close_together)


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

    if _ours(tail_log.tail_logfile):
        return
    _replace(tail_log, "tail_logfile", tail_logfile)  # TailLog.start looks the name up in the module


# The lasting patches: (patch, its installer, torch's module, class or "", the name replaced)
_LASTING: tuple[tuple[Patch, Callable[[], None], str, str, str], ...] = (
    (TAILERS_TOGETHER, stop_tailers_together, "torch.distributed.elastic.multiprocessing.api",
     "PContext", "close"),
    (OUTPUT, prompt_tailers, "torch.distributed.elastic.multiprocessing.tail_log", "",
     "tail_logfile"),
    (EVENT_NAMES, cheap_rendezvous_event_names,
     "torch.distributed.elastic.rendezvous.dynamic_rendezvous", "", "get_method_name"),
)


@contextmanager
def no_first_join_skew(one_node: bool) -> Iterator[None]:
    """Within the block, a c10d rendezvous of ``one_node`` joins without its random pause.

    torch's ``DynamicRendezvousHandler.next_rendezvous`` calls ``_delay(seconds=(0, 0.3))``
    before its first join "to slightly skew the rendezvous attempts across the nodes"; a run
    of one node has a single agent, and the pause (0.15 s on average) is all wait. Its other
    delays (a fixed second between polls of a rendezvous still forming) are kept.
    """
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    if not one_node:
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
    (The adapter refuses a launch where torch has none of the three.) Enter after
    ``forward_stop_signals``, in the main thread.
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
    if not ours:
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
def agent_hooks(after_monitor: Callable[[Any, Any], None] | None,
                before_close: Callable[[Any], None] | None, *,
                max_restarts: int | None) -> Iterator[None]:
    """Within the block, ``elastic_launch`` builds an agent of ours (unless ``max_restarts`` is
    None: torch names no class it builds one from) that hands each result of its
    ``_monitor_workers`` to ``after_monitor(agent, result)``, and the worker process context
    calls ``before_close(context)`` before it stops its workers (each unless None: the adapter
    leaves out a hook whose names torch lacks; what they decide is :mod:`.supervise`'s).

    The agent's restart count is probed on the live object, once torch's ``__init__`` ran: where
    it has none (a torch that keeps it under another name), the count is set to
    ``max_restarts`` under the name torch's other methods may still read, so a launch never
    depends on it; ``after_monitor`` is then not called, and one line says the restart
    policy is off (only when restarts were asked for: without them it has nothing to do).
    """
    import torch.distributed.elastic.multiprocessing.api as mp_api
    import torch.distributed.launcher.api as api

    with ExitStack() as stack:
        if max_restarts is not None:
            base = api.LocalElasticAgent
            monitored, count = after_monitor, max_restarts

            class _Agent(base):  # type: ignore[misc, valid-type]
                def __init__(self, *args: Any, **kwargs: Any) -> None:
                    super().__init__(*args, **kwargs)
                    self._scaletrain_policy = monitored is not None
                    if restart_count(self) is not None:
                        return
                    if not hasattr(self, RESTART_COUNT):
                        setattr(self, RESTART_COUNT, count)  # torch's own reads: as asked
                    if self._scaletrain_policy and count > 0:
                        off_at_use(RESTARTS, REMAINING_RESTARTS)
                    self._scaletrain_policy = False

                def _monitor_workers(self, worker_group: Any) -> Any:
                    result = super()._monitor_workers(worker_group)
                    if monitored is not None and self._scaletrain_policy:
                        monitored(self, result)
                    return result

            setattr(api, "LocalElasticAgent", _Agent)
            stack.callback(setattr, api, "LocalElasticAgent", base)
        if before_close is not None:
            base_close = mp_api.SubprocessContext._close
            closing = before_close

            def _close(ctx: Any, *args: Any, **kwargs: Any) -> Any:
                closing(ctx)
                return base_close(ctx, *args, **kwargs)

            setattr(mp_api.SubprocessContext, "_close", _close)
            stack.callback(setattr, mp_api.SubprocessContext, "_close", base_close)
        yield
