"""The per-process view of a distributed job: who am I, how many of us, on which device.

Two frozen records, built in this order and never patched afterwards:

- :class:`Placement`: who this process is in the job (ranks, sizes, rendezvous), read from
  the launcher's variables alone by ``runtime.detect``;
- :class:`Env`: the placement plus the resolved device and backend (``runtime.resolve``), what
  ``scaletrain.detect()`` and ``scaletrain.init()`` return.

Nothing here imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from scaletrain.settings import MAX_COUNT, Spec, check_fields, choice, count, kind, setting, str_mapping, text

# the detectors' names (scaletrain.runtime.detect), what ``launcher`` may say
LAUNCHERS = ("torchrun", "slurm", "openmpi", "pmi", "local")
_RANK = count(low=0, high=MAX_COUNT - 1)
_SIZE = count()


@dataclass(frozen=True, kw_only=True)
class Placement:
    """This process's place in the job, from the launcher's variables alone (no device).

    Attributes:
        rank: global rank, 0..world_size-1.
        local_rank: rank among the processes on this node, 0..local_world_size-1.
        world_size: number of processes in the job.
        local_world_size: number of processes on this node.
        node_rank: index of this node, 0..num_nodes-1.
        num_nodes: number of nodes in the job.
        master_addr: host of rank 0's rendezvous store.
        master_port: TCP port of that store.
        launcher: which detector found the job: ``torchrun``, ``slurm``, ``openmpi``, ``pmi``, ``local``.
        job_id: the scheduler's job id, or the torchrun run id, or ``None``.
        extra: launcher-specific read-only facts (e.g. ``cpus_per_task``), for tools and messages.
    """

    # each declared in the settings vocabulary: an Env made by hand (scaletrain.Env(rank=-1)) is
    # refused in one line where it is made, not deep in the loader or the Monitor that reads it
    rank: int = setting("global rank, 0..world_size-1", default=0, check=_RANK)
    local_rank: int = setting("rank on this node", default=0, check=_RANK)
    world_size: int = setting("processes in the job", default=1, check=_SIZE)
    local_world_size: int = setting("processes on this node", default=1, check=_SIZE)
    node_rank: int = setting("index of this node", default=0, check=_RANK)
    num_nodes: int = setting("nodes in the job", default=1, check=_SIZE)
    master_addr: str = setting("host of rank 0's rendezvous store", default="127.0.0.1", check=text())
    master_port: int = setting("TCP port of the rendezvous store", default=29500, check=count(1, 65535))
    launcher: str = setting("the detector that found the job", default="local", check=choice(LAUNCHERS))
    job_id: str | None = setting("the scheduler's job id", default=None, check=text())
    extra: dict[str, str] = setting("launcher-specific facts", factory=dict, check=str_mapping(), compare=False)

    def __post_init__(self) -> None:
        check_fields(self, owner=type(self).__name__)

    @property
    def is_main(self) -> bool:
        """True on global rank 0: the process that prints, logs and saves."""
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        """True on local rank 0: the process that does per-node work (data staging)."""
        return self.local_rank == 0

    @property
    def distributed(self) -> bool:
        """True when there is more than one process."""
        return self.world_size > 1

    def with_device(self, *, device: str, backend: str,
                    facts: dict[str, str] | None = None) -> Env:
        """The :class:`Env` of this placement on ``device``/``backend``; ``facts`` join ``extra``."""
        values = {f.name: getattr(self, f.name) for f in fields(Placement) if f.name != "extra"}
        return Env(**values, device=device, backend=backend,
                   extra={**self.extra, **(facts or {})})


@dataclass(frozen=True, kw_only=True)
class Env(Placement):
    """One process's place in the job and what it runs on: what ``init()`` returns.

    Attributes (besides :class:`Placement`'s):
        device: ``"cpu"``, ``"cuda:N"`` (ROCm's HIP devices use the same name), or ``"mps"``.
        backend: ``"nccl"`` on CUDA/ROCm, ``"gloo"`` on the CPU.
    """

    device: str = setting("cpu, cuda:N or mps", default="cpu",
                          check=text(pattern=re.compile(r"cpu|mps|cuda(:\d+)?"), shape="'cpu', 'cuda:N' or 'mps'"))
    backend: str = setting("the torch.distributed backend", default="gloo", check=text())

    def describe(self) -> str:
        """One line for logs: ``rank 3/8 (local 1/4, node 1/2) cuda:1 nccl via slurm job 42``."""
        job = f" job {self.job_id}" if self.job_id else ""
        return (
            f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}, "
            f"node {self.node_rank}/{self.num_nodes}) {self.device} {self.backend} "
            f"via {self.launcher}{job}"
        )


def _env_like(value: object) -> bool:
    """An Env, or a stand-in with its figures (a test's object with rank, world_size, local_rank
    and node_rank as ints and device as a str)."""
    if isinstance(value, Env):
        return True
    return all(isinstance(getattr(value, n, None), int) and not isinstance(getattr(value, n), bool)
               for n in ("rank", "world_size", "local_rank", "node_rank")) \
        and isinstance(getattr(value, "device", None), str)


# an ``env=`` argument (setup(), loader(), Monitor()), in the settings vocabulary
ENV = Spec(doc="the Env scaletrain.init() returned; leave it out for that one",
           check=kind(_env_like, "a scaletrain.Env (what scaletrain.init() returns)"), optional=True)
