"""Who this process is right now, and which device a collective uses: one answer for everyone.

A script can be in three states, and every consumer (the loader, the Monitor, the helpers,
checkpoint collectives, the stop agreement, the stop record) must read them the same way:

1. after ``scaletrain.init()``: its :class:`Env` is the truth;
2. after the script's own ``torch.distributed.init_process_group``: the live default group's
   rank and world size are the truth (the launcher's variables may say anything, e.g. a
   single process that made a group of one);
3. no group at all: the launcher's variables (:func:`scaletrain.detect`).

The answers: :func:`rank_world`, :func:`current_placement` (with the local rank) and
:func:`current_env` (with the device) for "who am I"; :func:`group_rank_world` for "who do I
reach in a collective" (nobody without a group, whatever the launcher says);
:func:`collective_device` for "where must a collective's tensor live"; :func:`error_rank` for
"which rank does an error message name". The checkpoint collectives, the export, the metrics,
the helpers, the stop agreement and record, the pipeline, the doctor and the benchmarks ask
these instead of torch or the environment. (``init()`` itself still compares an existing group
with the launcher's variables: that check is its own.)

Nothing here imports torch unless a process group already exists (``sys.modules``), so asking
"who am I" costs nothing in a script that never trains.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from scaletrain import settings
from scaletrain.errors import DistEnvError
from scaletrain.runtime.detect import detect, detect_placement
from scaletrain.runtime.env import Env, Placement
from scaletrain.runtime import session


def live_dist() -> Any | None:
    """``torch.distributed`` when its default process group is live, else None (no import)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def rank_world() -> tuple[int, int]:
    """(rank, world size) of this process: ``init()``'s, else the live group's, else the launcher's."""
    env = session.get()
    if env is not None:
        return env.rank, env.world_size
    dist = live_dist()
    if dist is not None:
        return int(dist.get_rank()), int(dist.get_world_size())
    placement = detect_placement()  # who am I is enough: no device decision here
    return placement.rank, placement.world_size


def _process_group(value: Any) -> bool:
    dist = sys.modules.get("torch.distributed")    # a group exists only once torch made one
    return dist is not None and isinstance(value, getattr(dist, "ProcessGroup", ()))


# a ``group=`` argument (loader(), all_reduce_mean(), gather_objects()), in the settings vocabulary
GROUP = settings.Spec(doc="a group from torch.distributed.new_group(); leave it out for the whole job",
                      check=settings.kind(_process_group, "a torch.distributed process group"), optional=True)


def group_rank_world(group: Any = None) -> tuple[int, int]:
    """(rank, size) of this process in ``group`` (default: the world), as a collective sees it.

    ``(0, 1)`` without a process group: no collective can reach another process, whatever the
    launcher's variables say. In a group this process is not a member of, torch's answer
    (rank -1).
    """
    dist = live_dist()
    if dist is None:
        return 0, 1
    if group is None:
        return rank_world()
    return int(dist.get_rank(group)), int(dist.get_world_size(group))


def error_rank() -> str | None:
    """The rank an error message names, or None; never raises (it runs in an excepthook).

    After ``init()`` or under a live group of several processes: this process's rank. Otherwise
    the error may be that the launcher's variables contradict each other, so they are not
    parsed: the launcher's raw ``RANK`` (torchrun) or ``SLURM_PROCID`` (srun), when a number.
    """
    if session.get() is not None or live_dist() is not None:
        try:
            rank, world = rank_world()
        except Exception:  # noqa: BLE001 - a group torn down under us: the launcher's word
            world = 1
        if world > 1:
            return str(rank)
    raw = os.environ.get("RANK") or os.environ.get("SLURM_PROCID")
    return raw if raw and raw.isascii() and raw.isdigit() else None


def _uses_cuda(backend: str) -> bool:
    # NCCL reduces only CUDA tensors; gloo (and the CPU part of "cpu:gloo,cuda:nccl") takes CPU ones
    backend = backend.lower()
    return "nccl" in backend and "cpu" not in backend


def collective_device(group: Any = None) -> str:
    """The device a tensor must live on for a collective over ``group`` (default: the world).

    ``"cuda:N"`` when the group's backend is NCCL only (N: the device ``init()`` chose, else
    torch's current device); ``"cpu"`` for gloo, for a mixed ``cpu:gloo,cuda:nccl`` backend, and
    without a process group.
    """
    dist = live_dist()
    if dist is None or not _uses_cuda(str(dist.get_backend(group))):
        return "cpu"
    env = session.get()
    if env is not None and env.device.startswith("cuda:"):
        return env.device
    import torch

    return f"cuda:{torch.cuda.current_device()}"


def _group_placement(dist: Any) -> Placement:
    """The place of a group the script started itself: its rank and size, the rest from the launcher."""
    rank, world = int(dist.get_rank()), int(dist.get_world_size())
    try:
        placement: Placement = detect_placement()
    except DistEnvError:  # contradictory launcher variables: the group still says who we are
        placement = Placement()
    if placement.world_size == world:
        # the group may number the ranks its own way; the node facts (local rank) still hold
        placement = dataclasses.replace(placement, rank=rank)
    else:
        # the launcher's variables describe another job (e.g. a group of one made by hand): keep
        # only what the group itself knows
        placement = Placement(rank=rank, world_size=world, launcher=placement.launcher,
                              job_id=placement.job_id)
    return placement


def current_placement() -> Placement:
    """Who this process is, without a device decision: ``init()``'s Env, else the live default
    group's place (see :func:`current_env`), else the launcher's (``detect_placement()``)."""
    env = session.get()
    if env is not None:
        return env
    dist = live_dist()
    if dist is not None:
        return _group_placement(dist)
    return detect_placement()


def current_env() -> Env:
    """This process's :class:`Env`: ``init()``'s, else the live default group's, else ``detect()``.

    The group's Env takes its rank and world size from the group and its device from the
    backend (``cuda:N`` for NCCL, ``cpu`` otherwise). Raises :class:`DistEnvError` only when
    there is no group and the launcher's variables contradict each other.
    """
    place = current_placement()
    if isinstance(place, Env):  # init()'s
        return place
    dist = live_dist()
    if dist is not None:
        return place.with_device(device=collective_device(), backend=str(dist.get_backend()))
    return detect()  # the launcher's place, with the device init() would choose
