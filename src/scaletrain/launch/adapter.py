"""One adapter for torch's internals: every private name `scaletrain run` touches, looked up
once when a launch starts, and what the launch does where one is missing.

torch names none of these as API, so a release may rename or drop any of them. Each patch of
:mod:`scaletrain.launch.patches` (and the runtime's two users of privates) is listed here with
every name it needs - an attribute, a function, or the keywords it is called with - each with
a probe that asks this process's torch (:mod:`scaletrain.torch_features`) and never a version
string. :func:`check` runs every probe before the first worker starts:

- a patch that only saves time (or adds a diagnosis) switches off with all its names at once,
  and one line says what is now slower or missing;
- a patch that changes behaviour (output copying, the restart policy, signal forwarding and
  with it the save on preemption) works, or the launch stops before any worker starts, with
  the reason and the way out: ``SCALETRAIN_TORCH_AS_IS=1`` runs torch's agent as it is,
  without any of our patches (as torchrun would);
- a torch newer than the newest one tested gets one line, not a failure.

Nothing here imports torch at import time; the probes import the module they look at.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from scaletrain.contract.environ import TORCH_AS_IS_VAR, torch_as_is
from scaletrain.errors import LaunchError
from scaletrain.launch.tailer import tail_logfile
from scaletrain.torch_features import (NEWEST_TESTED, SIGNALS_ENV, agent_reads_signals_env,
                                       launch_config_fields, mentions, ordered_parameters,
                                       pg_timeout_setter, process_groups, python_exit_steps,
                                       tail_logfile_parameters)


@dataclass(frozen=True, kw_only=True)
class Private:
    """One name of torch's (or CPython's) that is not its API, and how to find it."""

    name: str                    # where it lives, as a user would look it up
    kind: str                    # "attribute", "function" or "keyword"
    probe: Callable[[], bool]    # True where this process's torch has it, as used


@dataclass(frozen=True, kw_only=True)
class Patch:
    """A patch and the private names it needs: all the names of any one of its ``ways``."""

    name: str
    behaviour: bool              # changes what the run does (else: only its speed or a diagnosis)
    ways: tuple[tuple[Private, ...], ...]
    without: str                 # what the run is like with the patch off
    restarts_only: bool = False  # needed only when --max-restarts is above 0

    def missing(self) -> list[Private] | None:
        """None where one way has every name; else the missing names of every way."""
        lacks = [[p for p in way if not _probe(p)] for way in self.ways]
        if any(not names for names in lacks):
            return None
        return [p for names in lacks for p in names]


def _probe(private: Private) -> bool:
    try:
        return bool(private.probe())
    except Exception:  # noqa: BLE001 - a module moved or a class reshaped: the name is not there
        return False


def _concrete(function: Any) -> bool:
    """A method torch implements (not only the abstract one of a base class)."""
    return callable(function) and not getattr(function, "__isabstractmethod__", False)


def _mp() -> Any:
    from torch.distributed.elastic.multiprocessing import api
    return api


def _rdzv() -> Any:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    return dynamic_rendezvous


def _tail_log() -> Any:
    from torch.distributed.elastic.multiprocessing import tail_log
    return tail_log


def _launcher() -> Any:
    import torch.distributed.launcher.api as api
    return api


def _agent() -> Any:
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    return SimpleElasticAgent


def _tailer_parameters_fit() -> bool:
    theirs = tail_logfile_parameters()
    return bool(theirs) and ordered_parameters(tail_logfile)[:len(theirs)] == theirs


_RDZV = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
_MP = "torch.distributed.elastic.multiprocessing.api"
_C10D = "torch.distributed.distributed_c10d"

GET_METHOD_NAME = Private(name=f"{_RDZV}.get_method_name", kind="function",
                          probe=lambda: callable(getattr(_rdzv(), "get_method_name", None)))
DELAY = Private(name=f"{_RDZV}._delay(seconds=...)", kind="keyword",
                probe=lambda: "seconds" in ordered_parameters(_rdzv()._delay))
PCONTEXT_CLOSE = Private(name=f"{_MP}.PContext.close(death_sig, timeout)", kind="keyword",
                         probe=lambda: ordered_parameters(_mp().PContext.close)[1:3]
                         == ("death_sig", "timeout"))
PCONTEXT_END = Private(name=f"{_MP}.PContext._close", kind="function",
                       probe=lambda: callable(_mp().PContext._close)
                       and mentions(_mp().PContext.close, "_close"))
TAIL_LOGS = Private(name=f"{_MP}.PContext._tail_logs", kind="attribute",
                    probe=lambda: mentions(_mp().PContext.__init__, "_tail_logs")
                    or mentions(_mp().PContext.__init__, "_stdout_tail"))
FINISHED_EVENTS = Private(name="torch.distributed.elastic.multiprocessing.tail_log.TailLog"
                               "._finished_events", kind="attribute",
                          probe=lambda: mentions(_tail_log().TailLog.__init__, "_finished_events"))
TAIL_LOGFILE = Private(name="torch.distributed.elastic.multiprocessing.tail_log.tail_logfile",
                       kind="function", probe=lambda: mentions(_tail_log().TailLog.start,
                                                               "tail_logfile")
                       and callable(getattr(_tail_log(), "tail_logfile", None)))
TAIL_LOGFILE_ARGS = Private(name="tail_log.tail_logfile(header, file, dst, finished, ...)",
                            kind="keyword", probe=_tailer_parameters_fit)
SIGNALS_FIELD = Private(name="torch.distributed.launcher.api.LaunchConfig.signals_to_handle",
                        kind="attribute", probe=lambda: "signals_to_handle" in launch_config_fields())
SIGNALS_VARIABLE = Private(name=f"{_MP}.PContext.start reading {SIGNALS_ENV}", kind="attribute",
                           probe=agent_reads_signals_env)
TERMINATE_HANDLER = Private(name=f"{_MP}._terminate_process_handler", kind="function",
                            probe=lambda: callable(getattr(_mp(), "_terminate_process_handler",
                                                           None))
                            and mentions(_mp().PContext.start, "_terminate_process_handler"))
LOCAL_AGENT = Private(name="torch.distributed.launcher.api.LocalElasticAgent", kind="attribute",
                      probe=lambda: isinstance(getattr(_launcher(), "LocalElasticAgent", None),
                                               type)
                      and mentions(_launcher().launch_agent, "LocalElasticAgent"))
MONITOR_WORKERS = Private(name="torch.distributed.elastic.agent.server.api.SimpleElasticAgent"
                               "._monitor_workers", kind="function",
                          probe=lambda: callable(getattr(_agent(), "_monitor_workers", None))
                          and mentions(_agent()._invoke_run, "_monitor_workers"))
# The restart count's name: probed here in torch's code, and again on the live agent (a torch
# may set it under another name in an __init__ of its own, while this probe still finds it)
RESTART_COUNT = "_remaining_restarts"
REMAINING_RESTARTS = Private(name="torch.distributed.elastic.agent.server.api.SimpleElasticAgent"
                                  f".{RESTART_COUNT}", kind="attribute",
                             probe=lambda: mentions(_agent().__init__, RESTART_COUNT)
                             and mentions(_agent()._invoke_run, RESTART_COUNT))
SUBPROCESS_END = Private(name=f"{_MP}.SubprocessContext._close", kind="function",
                         probe=lambda: _concrete(getattr(_mp().SubprocessContext, "_close", None)))
SUBPROCESS_HANDLERS = Private(name=f"{_MP}.SubprocessContext.subprocess_handlers",
                              kind="attribute", probe=lambda: mentions(
                                  _mp().SubprocessContext.__init__, "subprocess_handlers"))
STDERRS = Private(name=f"{_MP}.PContext.stderrs", kind="attribute",
                  probe=lambda: mentions(_mp().PContext.__init__, "stderrs"))
PYTHON_EXIT = Private(name="threading._shutdown, atexit._run_exitfuncs (CPython)",
                      kind="function", probe=lambda: python_exit_steps() is not None)
SET_PG_TIMEOUT = Private(name=f"{_C10D}._set_pg_timeout(timeout, group)", kind="keyword",
                         probe=lambda: pg_timeout_setter() is not None)
PG_MAP = Private(name=f"{_C10D}._world.pg_map", kind="attribute",
                 probe=lambda: process_groups() is not None)

EVENT_NAMES = Patch(name="rendezvous event names", behaviour=False, ways=((GET_METHOD_NAME,),),
                    without="the rendezvous names each log event with inspect.stack() "
                            "(tens of milliseconds of each launch)")
TAILERS_TOGETHER = Patch(name="log tailers stopped together", behaviour=False,
                         ways=((PCONTEXT_CLOSE, PCONTEXT_END, TAIL_LOGS, FINISHED_EVENTS),),
                         without="each exit waits up to 0.2 s for torch's log tailers, "
                                 "stopped one after the other")
FIRST_JOIN = Patch(name="first join without a pause", behaviour=False, ways=((DELAY,),),
                   without="a one-node rendezvous waits a random 0-0.3 s before its first join")
LEAN_EXIT = Patch(name="exit without teardown", behaviour=False, ways=((PYTHON_EXIT,),),
                  without="the launcher tears its torch modules down at exit (about 0.25 s)")
FORENSICS = Patch(name="stacks before the workers are stopped", behaviour=False,
                  ways=((SUBPROCESS_END, SUBPROCESS_HANDLERS, STDERRS),),
                  without="a worker that dies of a collective timeout is reported without "
                          "the other ranks' stacks")
STEP_TIMEOUT = Patch(name="step timeout", behaviour=False, ways=((SET_PG_TIMEOUT, PG_MAP),),
                     without="a collective that stalls during training waits the start-up "
                             "timeout, not the step timeout (--timeout)")
OUTPUT = Patch(name="output copying", behaviour=True, ways=((TAIL_LOGFILE, TAIL_LOGFILE_ARGS),),
               without="workers' output would be copied by torch's tailer, which decodes it as "
                       "text and splits lines at \\r")
SIGNALS = Patch(name="signal forwarding", behaviour=True,
                ways=((SIGNALS_FIELD,), (SIGNALS_VARIABLE,), (TERMINATE_HANDLER,)),
                without="a SIGTERM (a preemption) would stop the workers at once, before "
                        "they save")
RESTARTS = Patch(name="restart policy", behaviour=True, restarts_only=True,
                 ways=((LOCAL_AGENT, MONITOR_WORKERS, REMAINING_RESTARTS),),
                 without="--max-restarts would restart workers that stopped on purpose (75) "
                         "or failed on a usage error, and say nothing when it restarts")

PATCHES: tuple[Patch, ...] = (EVENT_NAMES, TAILERS_TOGETHER, FIRST_JOIN, LEAN_EXIT, FORENSICS,
                              STEP_TIMEOUT, OUTPUT, SIGNALS, RESTARTS)
PRIVATES: tuple[Private, ...] = tuple(p for patch in PATCHES for way in patch.ways for p in way)


@dataclass(frozen=True)
class Adapter:
    """The patches this launch makes (their names all found), and whether torch runs as it is.
    ``agent``: torch's launcher builds its agent from the class :data:`LOCAL_AGENT` names, so an
    agent of ours can stand in for it (:func:`scaletrain.launch.patches.agent_hooks`)."""

    on: frozenset[str]
    as_is: bool = False
    agent: bool = False

    def __contains__(self, patch: object) -> bool:
        return isinstance(patch, Patch) and patch.name in self.on


def newer_than_tested(version: str) -> bool:
    """Whether torch ``version`` ("2.16.0+cpu", "2.16.0a0+git...") is past :data:`NEWEST_TESTED`."""
    def release(text: str) -> tuple[int, ...]:
        found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
        return tuple(int(n or 0) for n in found.groups()) if found else (0, 0, 0)

    return release(version) > release(NEWEST_TESTED)


def check(environ: Mapping[str, str], *, max_restarts: int, out: TextIO | None = None) -> Adapter:
    """Probe every private name once, at the start of a launch; see the module docstring.

    Prints one line per patch switched off (and for a torch newer than tested) to ``out``
    (stderr); raises :class:`LaunchError` where a behaviour patch cannot work.
    """
    import torch

    stream = sys.stderr if out is None else out
    version = str(torch.__version__)
    if newer_than_tested(version):
        print(f"scaletrain: torch {version} is newer than the newest tested ({NEWEST_TESTED}); "
              f"if the launch misbehaves, {TORCH_AS_IS_VAR}=1 runs torch's agent as it is",
              file=stream)
    if torch_as_is(environ):
        print(f"scaletrain: {TORCH_AS_IS_VAR} is set: torch's agent runs as it is, without "
              "scaletrain's patches (no restart policy, torch's own output copying and signal "
              "handling; collectives keep their start-up timeout)", file=stream)
        return Adapter(on=frozenset(), as_is=True)
    on = set()
    for patch in PATCHES:
        if patch.restarts_only and max_restarts == 0:
            continue
        missing = patch.missing()
        if missing is None:
            on.add(patch.name)
            continue
        names = ", ".join(p.name for p in missing)
        if patch.behaviour:
            raise LaunchError(
                f"torch {version} lacks {names}, which scaletrain's {patch.name} needs; "
                f"without it {patch.without}",
                f"set {TORCH_AS_IS_VAR}=1 to run torch's agent as it is (as torchrun would), "
                f"or use torch {NEWEST_TESTED} or older")
        print(f"scaletrain: torch {version} lacks {names}: {patch.name} is off, so "
              f"{patch.without}", file=stream)
    return Adapter(on=frozenset(on), agent=_probe(LOCAL_AGENT))


def restart_count(agent: object) -> int | None:
    """The live ``agent``'s restart count (:data:`RESTART_COUNT`), or None where the object has
    none as an int: its torch keeps the count under another name, whatever its code mentions."""
    value = getattr(agent, RESTART_COUNT, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def off_at_use(patch: Patch, private: Private, out: TextIO | None = None) -> None:
    """One line: ``private`` was missing when ``patch`` came to use it, so the launch goes on
    as torch's own code runs it (the line :func:`check` prints for a speed patch)."""
    print(f"scaletrain: torch's live agent lacks {private.name}: {patch.name} is off, so "
          f"{patch.without}", file=sys.stderr if out is None else out, flush=True)
