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

    Read from the method's source: its behaviour cannot be observed without starting workers.
    Where the source cannot be read (a frozen build), the answer is False and the launcher's
    fallback (:func:`scaletrain.launch.patches.torch_leaves_forwarded_signals`) applies, which
    is correct either way.
    """
    from torch.distributed.elastic.multiprocessing import api

    try:
        return SIGNALS_ENV in inspect.getsource(api.PContext.start)
    except (OSError, TypeError):
        return False


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


# What the launcher's patches of the elastic agent (scaletrain.launch.patches) replace: each is
# asked at each patch, not cached (tests replace these names), and where torch lacks one the
# patch leaves torch as it is. All are present in the installed release the tests run on
# (tests/unit/test_torch_features.py says so when one goes missing).

def rendezvous_names_events() -> bool:
    """Whether the dynamic rendezvous names its log events with ``get_method_name``."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    return callable(getattr(rdzv, "get_method_name", None))


def rendezvous_skews_first_join() -> bool:
    """Whether the dynamic rendezvous pauses through its module's ``_delay`` (a random
    ``(0, 0.3)`` s before its first join)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    return callable(getattr(rdzv, "_delay", None))


def pcontext_closes() -> bool:
    """Whether the agent's worker context has ``PContext.close`` (which ends the workers
    through ``_close``, then stops its log tailers)."""
    from torch.distributed.elastic.multiprocessing import api

    return callable(getattr(api.PContext, "close", None))


def agent_terminate_handler() -> bool:
    """Whether the worker context installs its stop-now handler by the module-level name
    ``_terminate_process_handler`` (looked up when ``PContext.start`` runs)."""
    from torch.distributed.elastic.multiprocessing import api

    return callable(getattr(api, "_terminate_process_handler", None))


def subprocess_context_closes() -> bool:
    """Whether the subprocess worker context stops its workers in ``_close``."""
    from torch.distributed.elastic.multiprocessing import api

    return callable(getattr(api.SubprocessContext, "_close", None))


def agent_monitors_workers() -> bool:
    """Whether ``elastic_launch`` builds the ``LocalElasticAgent`` it finds in
    ``torch.distributed.launcher.api`` and polls its workers through ``_monitor_workers``."""
    import torch.distributed.launcher.api as api

    return callable(getattr(getattr(api, "LocalElasticAgent", None), "_monitor_workers", None))
