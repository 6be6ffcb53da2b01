"""The per-process view of a distributed job: who am I, how many of us, on which device.

Two frozen records, built in this order and never patched afterwards:

- :class:`Placement`: who this process is in the job (ranks, sizes, rendezvous), read from
  the launcher's variables alone by ``runtime.detect``;
- :class:`Env`: the placement plus the resolved device and backend (``runtime.resolve``), what
  ``scaletrain.detect()`` and ``scaletrain.init()`` return.

Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


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

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    launcher: str = "local"
    job_id: str | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

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

    device: str = "cpu"
    backend: str = "gloo"

    def describe(self) -> str:
        """One line for logs: ``rank 3/8 (local 1/4, node 1/2) cuda:1 nccl via slurm job 42``."""
        job = f" job {self.job_id}" if self.job_id else ""
        return (
            f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}, "
            f"node {self.node_rank}/{self.num_nodes}) {self.device} {self.backend} "
            f"via {self.launcher}{job}"
        )
