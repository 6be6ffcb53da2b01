"""Who this process is right now, and which device a collective uses: one answer for everyone.

A script can be in three states, and every consumer (the loader, the Monitor, the helpers,
checkpoint collectives, the stop agreement, the stop record) must read them the same way:

1. after ``scaletrain.init()``: its :class:`Env` is the truth;
2. after the script's own ``torch.distributed.init_process_group``: the live default group's
   rank and world size are the truth (the launcher's variables may say anything, e.g. a
   single process that made a group of one);
3. no group at all: the launcher's variables (:func:`scaletrain.detect`).

Nothing here imports torch unless a process group already exists (``sys.modules``), so asking
"who am I" costs nothing in a script that never trains.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from scaletrain.errors import DistEnvError
from scaletrain.runtime.detect import detect, detect_placement
from scaletrain.runtime.env import Env, Placement
from scaletrain.runtime import init as _init


def live_dist() -> Any | None:
    """``torch.distributed`` when its default process group is live, else None (no import)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def rank_world() -> tuple[int, int]:
    """(rank, world size) of this process: ``init()``'s, else the live group's, else the launcher's."""
    env = _init.current()  # looked up on the module: init() may come later
    if env is not None:
        return env.rank, env.world_size
    dist = live_dist()
    if dist is not None:
        return int(dist.get_rank()), int(dist.get_world_size())
    placement = detect_placement()  # who am I is enough: no device decision here
    return placement.rank, placement.world_size


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
    env = _init.current()  # looked up on the module: init() may come later
    if env is not None and env.device.startswith("cuda:"):
        return env.device
    import torch

    return f"cuda:{torch.cuda.current_device()}"


def _group_env(dist: Any) -> Env:
    """The Env of a group the script started itself: its rank and size, the rest from the launcher."""
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
    backend = str(dist.get_backend())
    return placement.with_device(device=collective_device(), backend=backend)


def current_env() -> Env:
    """This process's :class:`Env`: ``init()``'s, else the live default group's, else ``detect()``.

    The group's Env takes its rank and world size from the group and its device from the
    backend (``cuda:N`` for NCCL, ``cpu`` otherwise). Raises :class:`DistEnvError` only when
    there is no group and the launcher's variables contradict each other.
    """
    env = _init.current()  # looked up on the module: init() may come later
    if env is not None:
        return env
    dist = live_dist()
    if dist is not None:
        return _group_env(dist)
    return detect()
