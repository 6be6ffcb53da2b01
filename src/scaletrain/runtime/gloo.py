"""scaletrain's own gloo group beside the training's, made so that it does not connect every rank
to every other.

scaletrain makes a CPU group of its own where its collectives must not share the training's
(the checkpoint's, on gloo whatever the training uses; ``doctor``'s table under NCCL). torch
connects a gloo group eagerly: every rank writes its address list to the rendezvous store (154
bytes, plus 8 per rank), reads every rank's, and opens a TCP connection to each - N^2 reads of
values that grow with N, about 10^14 bytes from one store at 24,000 ranks, and N-1 sockets in
every process (recorded at 4 ranks and replayed at N: ``benchmarks/scale_startup.py``,
docs/scale.md). Made while ``TORCH_GLOO_LAZY_INIT=1``, which torch reads when it makes a gloo
group (where it knows it: torch 2.13 and 2.15 do, 2.6 does not and connects eagerly, as
before), a rank reads a peer's address and connects to it the first time a
collective needs that peer: rank 0 to every rank (gathers, scatters), the others to rank 0 and
a few neighbours (rings, trees).

Rank 0 then holds a socket per rank, as it does for the rendezvous store it hosts (torch's
TCPStore server keeps every rank's connection open). Where this process's soft limit of open
files is below what that takes, :func:`enough_files` raises it towards the hard limit (which any
process may do; ``scaletrain.init`` on rank 0, and :func:`new_lazy_group`), so that a login
shell's 1024, inherited through ``srun``, does not refuse rank 1024 at the start or end a job of
2,000 ranks at its first checkpoint.
"""

from __future__ import annotations

import os
from typing import Any

LAZY_VAR = "TORCH_GLOO_LAZY_INIT"   # torch's switch, read when a gloo group is made
FILES_MARGIN = 1024                 # descriptors beyond one per rank: files, the training's own sockets


def new_lazy_group(dist: Any) -> Any:
    """``dist.new_group(backend="gloo")`` over every rank, connected lazily (a collective: every
    rank calls it). A value of ``TORCH_GLOO_LAZY_INIT`` the user set is left as it is."""
    if dist.get_rank() == 0:
        enough_files(2 * dist.get_world_size() + FILES_MARGIN)   # and the store it may host
    if LAZY_VAR in os.environ:
        return dist.new_group(backend="gloo")
    os.environ[LAZY_VAR] = "1"   # read by torch in the call below, and taken back right after
    try:
        return dist.new_group(backend="gloo")
    finally:
        os.environ.pop(LAZY_VAR, None)


def enough_files(wanted: int) -> int:
    """Raise this process's soft limit of open files to ``wanted`` (at most the hard limit) when
    it is lower; the soft limit now. Nothing is changed where it is high enough already."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target <= soft:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # a container that forbids it: the old limit stands
        return soft
    return target
