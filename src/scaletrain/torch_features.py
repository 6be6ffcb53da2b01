"""What this process's torch can do, asked of torch itself: one place for every API that
differs inside the supported range (docs/torch-support.md).

scaletrain supports torch 2.6 and newer (``pyproject.toml``). Between 2.6 and today's release
some of the APIs it uses gained fields or arguments; each is a feature test here - a look at
a signature, a dataclass field or an attribute - never a comparison of version strings, so a
backport, a nightly or a centre's own build answers for what it has. The callers keep the
fallback beside the call; the docstrings say which releases were checked to have what
(2.6.0, 2.7.1, 2.8.0, 2.9.1, 2.10.0, 2.11.0, 2.12.1, 2.13.0 and 2.15.0).

Every test imports only the torch module it looks at, and only when called (``import
scaletrain`` never imports torch); each answer is cached for the process.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import Any

# The environment variable a torch that reads it takes the agent's signal list from.
SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"


@lru_cache(maxsize=None)
def launch_config_fields() -> frozenset[str]:
    """The fields of torch's ``LaunchConfig`` (what ``elastic_launch`` accepts).

    ``signals_to_handle``: absent in 2.6.0 to 2.9.1; present from 2.10.0. ``shutdown_timeout``:
    absent up to 2.11.0 (the release that failed with "unexpected keyword argument
    'shutdown_timeout'"); present from 2.12.1. The launcher passes only the fields this set
    holds (:func:`scaletrain.launch.local._config`).
    """
    from torch.distributed.launcher.api import LaunchConfig

    return frozenset(f.name for f in dataclasses.fields(LaunchConfig))


@lru_cache(maxsize=None)
def agent_reads_signals_env() -> bool:
    """Whether the agent's worker context takes the signals it handles from
    ``TORCHELASTIC_SIGNALS_TO_HANDLE`` (``PContext.start`` reads it: 2.10.0 and newer, the
    release that also added ``LaunchConfig.signals_to_handle``), rather than always handling
    SIGTERM, SIGINT, SIGHUP and SIGQUIT (2.6.0 to 2.9.1).

    Read from the method's code (:func:`mentions`): its behaviour cannot be observed without
    starting workers.
    """
    from torch.distributed.elastic.multiprocessing import api

    return mentions(api.PContext.start, SIGNALS_ENV)


@lru_cache(maxsize=None)
def dcp_parameters(name: str) -> frozenset[str]:
    """The keyword arguments of ``torch.distributed.checkpoint.<name>`` ("save", "load",
    "async_save").

    ``no_dist``: not on 2.6.0's ``save``/``load`` (they infer it from whether a process group
    is up); an argument of those from 2.7.1, and of ``async_save`` from 2.9.1. ``async_stager``
    (what copies the state off the GPU for ``async_save``): from 2.9.1.
    """
    import torch.distributed.checkpoint as dcp

    return frozenset(ordered_parameters(getattr(dcp, name)))


@lru_cache(maxsize=None)
def dcp_default_stager() -> bool:
    """Whether DCP has ``DefaultStager`` and ``StagingOptions`` (pinned, reusable staging
    buffers for ``async_save``): from 2.9.1; on 2.6.0 to 2.8.0 DCP stages with its own copy."""
    try:
        from torch.distributed.checkpoint import staging
    except ImportError:
        return False
    return hasattr(staging, "DefaultStager") and hasattr(staging, "StagingOptions")


@lru_cache(maxsize=None)
def tail_logfile_parameters() -> tuple[str, ...]:
    """The parameters of the agent's log tailer ``tail_log.tail_logfile``, in order (empty
    where there is none).

    2.6.0 to 2.9.1: ``(header, file, dst, finished, interval_sec)``; 2.10.0 and newer add
    ``log_line_filter`` (for the LaunchConfig's ``duplicate_*_filters``).
    """
    from torch.distributed.elastic.multiprocessing import tail_log

    function = getattr(tail_log, "tail_logfile", None)
    return ordered_parameters(function) if callable(function) else ()


def ordered_parameters(function: Callable[..., Any]) -> tuple[str, ...]:
    """``function``'s parameter names in order (empty where it has no signature)."""
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return ()


@lru_cache(maxsize=None)
def schedule_scales_grads(schedule_cls: Any) -> bool:
    """Whether a ``torch.distributed.pipelining`` schedule takes ``scale_grads`` (from 2.7.1:
    it divides each gradient by the number of micro-batches, so a mean loss gives the
    gradient of the batch's mean). 2.6.0's schedules sum the micro-batches' gradients."""
    return "scale_grads" in ordered_parameters(schedule_cls.__init__)


def schedule_step_parameters(schedule: Any) -> frozenset[str]:
    """The parameters of a pipelining schedule's ``step`` (a schedule or its class).
    ``return_outputs``: from 2.10.0; before it, ``step`` hands every keyword it does not know
    to the model's ``forward``."""
    return frozenset(ordered_parameters(schedule.step))


def schedule_has_eval(schedule: Any) -> bool:
    """Whether a pipelining schedule has ``eval`` (a forward-only pass): from 2.9.1."""
    return callable(getattr(schedule, "eval", None))


def fsdp_on_cpu() -> bool:
    """Whether FSDP2 (``fully_shard``) can run on the CPU (gloo): its CPU "streams" have the
    ``record_event``/``wait_event`` it calls from 2.7.1; on 2.6.0 FSDP2 runs on GPUs only."""
    import torch

    return hasattr(torch.cpu.Stream, "record_event")


# The torch release the range script tested last (constraints/torch-newest.txt pins the same; a
# unit test holds them together). A newer torch gets one line at launch (launch/adapter.py).
NEWEST_TESTED = "2.15.0"


def mentions(function: Any, name: str) -> bool:
    """Whether ``function``'s code names ``name`` (an attribute or global it looks up, or a
    string constant), in its own code or a function defined inside it.

    How a private name torch uses inside a method is found without reading source files (a
    frozen build has none) and without running the method: ``SimpleElasticAgent.__init__``
    sets ``_remaining_restarts`` exactly when its code holds that name.
    """
    code = getattr(function, "__code__", None)
    stack = [code] if code is not None else []
    while stack:
        current = stack.pop()
        if name in current.co_names or name in current.co_consts:
            return True
        stack.extend(c for c in current.co_consts if hasattr(c, "co_names"))
    return False


def python_exit_steps() -> tuple[Callable[[], None], Callable[[], None]] | None:
    """CPython's own exit steps, ``threading._shutdown`` (join non-daemon threads) and
    ``atexit._run_exitfuncs``, or None where this Python lacks either (another
    implementation): then a caller exits with ``sys.exit``."""
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if not callable(shutdown) or not callable(run_exit_handlers):
        return None
    return shutdown, run_exit_handlers


def run_atexit_handlers() -> None:
    """Run the ``atexit`` handlers now (before an ``os._exit``); nothing where Python lacks
    ``atexit._run_exitfuncs``."""
    steps = python_exit_steps()
    if steps is not None:
        steps[1]()


def pg_timeout_setter() -> Callable[[Any, Any], None] | None:
    """torch's ``distributed_c10d._set_pg_timeout(timeout, group)``, which changes an existing
    group's timeout in place (every release from 2.6.0 to 2.15.0), or None where it is gone or
    takes other arguments: then groups keep the timeout they were created with."""
    from torch.distributed import distributed_c10d as c10d

    setter = getattr(c10d, "_set_pg_timeout", None)
    if not callable(setter) or ordered_parameters(setter)[:2] != ("timeout", "group"):
        return None
    return setter


def process_groups() -> list[Any] | None:
    """Every process group this process created (``distributed_c10d._world.pg_map``'s keys),
    or None where torch keeps them elsewhere."""
    from torch.distributed import distributed_c10d as c10d

    pg_map = getattr(getattr(c10d, "_world", None), "pg_map", None)
    return list(pg_map.keys()) if isinstance(pg_map, dict) else None


def forget_answers() -> None:
    """Drop every cached answer (tests that simulate another torch ask again)."""
    for answer in (launch_config_fields, agent_reads_signals_env, dcp_parameters,
                   dcp_default_stager, tail_logfile_parameters, schedule_scales_grads):
        answer.cache_clear()
