"""The per-process view of a distributed job: who am I, how many of us, on which device.

``Env`` is what ``scaletrain.detect()`` and ``scaletrain.init()`` return. It is frozen: code
that needs another value builds a new one (``dataclasses.replace``). Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class Env:
    """One process's place in the job.

    Attributes:
        rank: global rank, 0..world_size-1.
        local_rank: rank among the processes on this node, 0..local_world_size-1.
        world_size: number of processes in the job.
        local_world_size: number of processes on this node.
        node_rank: index of this node, 0..num_nodes-1.
        num_nodes: number of nodes in the job.
        master_addr: host of rank 0's rendezvous store.
        master_port: TCP port of that store.
        device: ``"cpu"``, ``"cuda:N"`` (ROCm's HIP devices use the same name), or ``"mps"``.
        backend: ``"nccl"`` on CUDA/ROCm, ``"gloo"`` on the CPU.
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
    device: str = "cpu"
    backend: str = "gloo"
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

    def describe(self) -> str:
        """One line for logs: ``rank 3/8 (local 1/4, node 1/2) cuda:1 nccl via slurm job 42``."""
        job = f" job {self.job_id}" if self.job_id else ""
        return (
            f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}, "
            f"node {self.node_rank}/{self.num_nodes}) {self.device} {self.backend} "
            f"via {self.launcher}{job}"
        )
