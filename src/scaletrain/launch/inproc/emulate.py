"""The variables srun or mpirun would give a task, built from a worker's place in a local run.

``scaletrain run --emulate slurm`` lets a program written for ``srun`` (it reads
``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID`` ...) run and be debugged on a laptop or a
login node before it is queued; ``--emulate mpi`` does the same for programs that read Open MPI's
``OMPI_COMM_WORLD_*``. The local workers can be spread over emulated nodes
(``--nnodes 2 --nproc-per-node 2``: 4 workers, 2 per emulated node), so rank arithmetic such as
``SLURM_NODEID * gpus_per_node + SLURM_LOCALID`` is exercised.

Pure functions: a worker's place in, a dict of variables out. The torchrun variables
(``RANK``, ``WORLD_SIZE`` ...) are what real srun does *not* set, so the worker shim removes them -
unless the user exported them before ``scaletrain run``, as a batch script that computes
``WORLD_SIZE`` from Slurm's variables does before ``srun``: those are kept, with their values.
``MASTER_ADDR``/``MASTER_PORT`` stay, as a batch script would export them: the user's own when
exported (the launcher's rendezvous then runs on another port), else a free port of the launcher's.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

MODES = ("slurm", "mpi")
HOST_PREFIX = "emu-node"  # emulated node names; a rendezvous at one of them meets on loopback
# What the elastic agent sets and srun/mpirun would not (TORCHELASTIC_ERROR_FILE stays: torch's
# @record writes the failure report there, which the launcher reads).
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_USE_AGENT_STORE")
# Every variable the agent writes over in a worker's environment: a value the user exported
# before ``scaletrain run --emulate`` (a batch script's, before ``srun``) is given back to the task.
USER_KEPT_VARS = (*TORCHRUN_VARS, "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True, kw_only=True)
class Place:
    """One worker's place: global rank of ``world``, spread evenly over ``nodes`` nodes."""

    rank: int
    world: int
    nodes: int = 1
    cpus_per_task: int = 1
    gpus_per_node: int = 0
    job_id: str = "1"

    @property
    def per_node(self) -> int:
        return self.world // self.nodes

    @property
    def node(self) -> int:
        return self.rank // self.per_node

    @property
    def local_rank(self) -> int:
        return self.rank % self.per_node


def node_names(nodes: int) -> tuple[str, str, list[str]]:
    """(SLURM_JOB_NODELIST, its first host, every host): ``localhost`` for one node.

    Several emulated nodes get names that do not resolve (``emu-node[1-2]``); programs that
    need an address use MASTER_ADDR, which the launcher exports as a batch script would. A
    program that computes MASTER_ADDR from the node list gets ``emu-node1``: the worker shim
    turns a rendezvous there into one on loopback (:mod:`scaletrain.launch.inproc.rendezvous`).
    """
    if nodes == 1:
        return "localhost", "localhost", ["localhost"]
    hosts = [f"{HOST_PREFIX}{i}" for i in range(1, nodes + 1)]
    return f"{HOST_PREFIX}[1-{nodes}]", hosts[0], hosts


def is_emulated_host(host: str) -> bool:
    """True for a name :func:`node_names` made up (``emu-node2``): it is this machine."""
    rest = host[len(HOST_PREFIX):] if host.startswith(HOST_PREFIX) else ""
    return rest.isdigit()


def _per_node(count: str, nodes: int) -> str:
    """Slurm's per-node count for identical nodes: ``4`` on one, ``4(x2)`` on two."""
    return f"{count}(x{nodes})" if nodes > 1 else count


def slurm_vars(place: Place, *, job_name: str = "scaletrain-emulated") -> dict[str, str]:
    """The variables of one srun task at ``place`` (job and step values, as srun exports them)."""
    nodelist, _, hosts = node_names(place.nodes)
    per_node = _per_node(str(place.per_node), place.nodes)
    out = {
        "SLURM_JOB_ID": place.job_id, "SLURM_JOBID": place.job_id, "SLURM_JOB_NAME": job_name,
        "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_PROCID": str(place.rank), "SLURM_LOCALID": str(place.local_rank),
        "SLURM_NODEID": str(place.node),
        "SLURM_NTASKS": str(place.world), "SLURM_NPROCS": str(place.world),
        "SLURM_STEP_NUM_TASKS": str(place.world),
        "SLURM_NNODES": str(place.nodes), "SLURM_JOB_NUM_NODES": str(place.nodes),
        "SLURM_STEP_NUM_NODES": str(place.nodes),
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": per_node, "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURM_NTASKS_PER_NODE": str(place.per_node),
        "SLURMD_NODENAME": hosts[place.node], "SLURM_TOPOLOGY_ADDR": hosts[place.node],
        "SLURM_CPUS_PER_TASK": str(place.cpus_per_task),
        "SLURM_CPUS_ON_NODE": str(place.cpus_per_task * place.per_node),
        "SLURM_JOB_CPUS_PER_NODE": _per_node(str(place.cpus_per_task * place.per_node),
                                             place.nodes),
        "SLURM_GTIDS": ",".join(str(place.node * place.per_node + i)
                                for i in range(place.per_node)),
        "SLURM_SUBMIT_DIR": os.getcwd(), "SLURM_SUBMIT_HOST": socket.gethostname(),
        "SLURM_CLUSTER_NAME": "emulated", "SLURM_JOB_PARTITION": "emulated",
    }
    if place.gpus_per_node:
        # what srun sets in a job that asked for --gpus-per-node=N (srun(1), sbatch(1) of
        # Slurm 22.05: SLURM_GPUS_ON_NODE always, SLURM_GPUS_PER_NODE as the option gave it)
        gpus = ",".join(str(i) for i in range(place.gpus_per_node))
        out.update({"SLURM_GPUS_ON_NODE": str(place.gpus_per_node),
                    "SLURM_GPUS_PER_NODE": str(place.gpus_per_node), "SLURM_JOB_GPUS": gpus,
                    "SLURM_STEP_GPUS": gpus})
    return out


def mpi_vars(place: Place) -> dict[str, str]:
    """The variables Open MPI's mpirun gives the process at ``place``."""
    return {
        "OMPI_COMM_WORLD_RANK": str(place.rank), "OMPI_COMM_WORLD_SIZE": str(place.world),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(place.local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(place.per_node),
        "OMPI_COMM_WORLD_NODE_RANK": str(place.node), "OMPI_UNIVERSE_SIZE": str(place.world),
        "OMPI_MCA_ess_base_jobid": place.job_id,
    }


def emulated_vars(mode: str, place: Place) -> dict[str, str]:
    """``slurm_vars`` or ``mpi_vars`` for ``mode``."""
    if mode == "slurm":
        return slurm_vars(place)
    if mode == "mpi":
        return mpi_vars(place)
    raise ValueError(f"unknown emulation {mode!r}")
