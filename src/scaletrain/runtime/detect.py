"""Find out how this process was launched and what its place in the job is; change nothing.

One small read-only class per launcher, each reading a table of variable names, tried in a
fixed order: torchrun (also ``scaletrain run``, Accelerate and DeepSpeed, which export the
same contract), Slurm's srun, Open MPI, MPICH/Intel MPI/PMI, and finally a single local
process. torchrun comes before Slurm because torchrun runs inside Slurm jobs. Slurm steps
back when an MPI launcher's world size disagrees with ``SLURM_NTASKS``: then ``mpirun`` started
the ranks inside one Slurm task per node, and the nearest launcher is the one that knows.

The detectors answer "who am I in the job" (a :class:`Placement`: ranks, sizes, rendezvous)
from the environment alone; no cluster profile is read (a generated script exports
MASTER_ADDR, with the cluster's interface suffix, and the launcher's choices as
``SCALETRAIN_*`` variables). :func:`detect` adds the device and backend through the same
resolve step ``init()`` uses (``runtime.resolve``), counting GPUs from the environment.
Nothing here has side effects: no process group, no device change, no ``os.environ`` write,
no torch import. Contradictory environments raise :class:`DistEnvError` with the variables
named and a HINT.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import ClassVar

from scaletrain import settings
from scaletrain.contract.environ import DEFAULT_PORT, port_from_job_id
from scaletrain.errors import DistEnvError
from scaletrain.runtime.device import gpu_view
from scaletrain.runtime.env import Env, Placement
from scaletrain.runtime.nodelist import first_host, parse_tasks_per_node
from scaletrain.runtime.resolve import choose_backend, choose_device, read_request

def _int(environ: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    """An integer variable, None when unset; DistEnvError when not an integer >= minimum."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    text = raw.strip()
    try:
        # int() also reads Arabic-Indic and other Unicode digits, which Slurm never writes:
        # such a value was typed or forged, and the launcher beside us reads it differently
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise ValueError(text)
        value = int(text)
    except ValueError:
        raise DistEnvError(f"{name}={raw!r} is not an integer",
                           f"unset {name} or give it a whole number") from None
    if value < minimum:
        raise DistEnvError(f"{name}={raw!r} must be >= {minimum}",
                           f"unset {name} or give it a value >= {minimum}")
    return value


def _first(environ: Mapping[str, str], names: tuple[str, ...], *,
           minimum: int = 0) -> tuple[int | None, str]:
    """The first set variable of ``names`` as an integer, with its name."""
    for name in names:
        value = _int(environ, name, minimum=minimum)
        if value is not None:
            return value, name
    return None, names[0]


def _check(*, rank: tuple[int, str], world: tuple[int, str], local: tuple[int, str],
           local_world: tuple[int, str], launcher: str) -> None:
    """Ranks inside their sizes; messages name the variables that disagree."""
    if rank[0] >= world[0]:
        raise DistEnvError(f"{rank[1]}={rank[0]} is not below {world[1]}={world[0]}",
                           f"the {launcher} variables contradict each other: launch again "
                           f"instead of setting {rank[1]} by hand")
    if local[0] >= local_world[0]:
        raise DistEnvError(f"{local[1]}={local[0]} is not below {local_world[1]}={local_world[0]}",
                           f"the {launcher} variables contradict each other: launch again "
                           f"instead of setting {local[1]} by hand")
    if local_world[0] > world[0]:
        raise DistEnvError(f"{local_world[1]}={local_world[0]} exceeds {world[1]}={world[0]}",
                           "processes per node cannot exceed the world size")


def _master(environ: Mapping[str, str], addr: str, port: int) -> tuple[str, int]:
    """A user-set MASTER_ADDR / MASTER_PORT always wins over what we derived."""
    user_addr = environ.get("MASTER_ADDR", "").strip()
    user_port = _int(environ, "MASTER_PORT", minimum=1)
    if user_port is not None and user_port > 65535:
        raise DistEnvError(f"MASTER_PORT={user_port} is not a TCP port",
                           "use a port between 1024 and 65535")
    return user_addr or addr, user_port if user_port is not None else port


def _agree_with_slurm(environ: Mapping[str, str], *, rank: int, world: int) -> None:
    """Hand-set ``RANK``/``WORLD_SIZE`` must agree with the Slurm task this process is.

    A launcher that starts workers inside a Slurm task gives them ranks of its own, and
    ``SLURM_PROCID`` is the launcher's task: torchrun and ``scaletrain run`` mark their workers
    with ``TORCHELASTIC_RUN_ID``, DeepSpeed and ``torch.distributed.launch`` with ``LOCAL_RANK``.
    Without either mark the variables were set by hand or inherited from a shell, and this
    process is the Slurm task itself: if they disagree, the rendezvous would wait 30 minutes
    for ranks that nobody started.
    """
    if "TORCHELASTIC_RUN_ID" in environ or environ.get("LOCAL_RANK", "").strip():
        return
    job_id, _ = SlurmEnv._get(environ, "job_id")
    procid = _int(environ, "SLURM_PROCID")
    if job_id is None or procid is None:
        return
    step, _ = SlurmEnv._get(environ, "step_id")
    if step is None:  # the batch script itself is one process, whatever --ntasks asked for
        expected = (0, 1)
        what = (f"the batch script of Slurm job {job_id} (SLURM_PROCID={procid}, no "
                "SLURM_STEP_ID: one process)")
    else:
        ntasks, ntasks_var = _first(environ, SlurmEnv.VARS["world_size"], minimum=1)
        if ntasks is None:
            return
        expected = (procid, ntasks)
        what = f"this Slurm task (SLURM_PROCID={procid} {ntasks_var}={ntasks})"
    if (rank, world) == expected:
        return
    raise DistEnvError(f"RANK={rank} WORLD_SIZE={world} contradict {what} and no launcher "
                       "such as torchrun set them",
                       "unset RANK and WORLD_SIZE (inherited from your shell?) so Slurm's "
                       "variables decide, or start the ranks with torchrun or 'scaletrain run'")


class Detector:
    """Base of the launcher detectors: ``detect(environ)`` returns a Placement or None."""

    name: ClassVar[str] = ""

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> Placement | None:  # pragma: no cover - abstract
        raise NotImplementedError


class TorchrunEnv(Detector):
    """torchrun / ``scaletrain run`` / torch elastic: the env:// contract (seed 002)."""

    name = "torchrun"
    VARS: ClassVar[dict[str, str]] = {
        "rank": "RANK", "local_rank": "LOCAL_RANK", "world_size": "WORLD_SIZE",
        "local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "GROUP_RANK",
        "num_nodes": "GROUP_WORLD_SIZE", "run_id": "TORCHELASTIC_RUN_ID",
        "restarts": "TORCHELASTIC_RESTART_COUNT",
    }

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> Placement | None:
        v = cls.VARS
        rank = _int(environ, v["rank"])
        world = _int(environ, v["world_size"], minimum=1)
        if rank is None and world is None:
            return None
        if rank is None or world is None:
            have, missing = ("rank", "world_size") if world is None else ("world_size", "rank")
            raise DistEnvError(f"{v[have]} is set but {v[missing]} is not",
                               f"set both {v['rank']} and {v['world_size']} (torchrun "
                               f"does), or unset {v[have]}")
        _agree_with_slurm(environ, rank=rank, world=world)
        local = _int(environ, v["local_rank"])
        local_world = _int(environ, v["local_world_size"], minimum=1)
        if local is None:  # a hand-made env:// setup on one node
            local = rank if local_world is None else rank % local_world
        if local_world is None:
            local_world = world
        _check(rank=(rank, v["rank"]), world=(world, v["world_size"]),
               local=(local, v["local_rank"]), local_world=(local_world, v["local_world_size"]),
               launcher=cls.name)
        nodes = _int(environ, v["num_nodes"], minimum=1) or -(-world // local_world)
        node = _int(environ, v["node_rank"])
        node = rank // local_world if node is None else node
        if node >= nodes:
            raise DistEnvError(f"{v['node_rank']}={node} is not below {nodes} nodes",
                               "the torchrun variables contradict each other")
        if world > 1 and not environ.get("MASTER_ADDR", "").strip():
            raise DistEnvError(f"{v['world_size']}={world} but MASTER_ADDR is not set",
                               "export MASTER_ADDR (host of rank 0) and MASTER_PORT, or start "
                               "the script with 'scaletrain run'")
        addr, port = _master(environ, "127.0.0.1", DEFAULT_PORT)
        extra = {k: environ[name] for k, name in (("run_id", v["run_id"]),
                                                  ("restarts", v["restarts"]))
                 if name in environ}
        return Placement(rank=rank, local_rank=local, world_size=world, local_world_size=local_world,
                   node_rank=node, num_nodes=nodes, master_addr=addr, master_port=port,
                   launcher=cls.name, job_id=environ.get(v["run_id"]) or None, extra=extra)


class SlurmEnv(Detector):
    """An srun task. Step values (``SLURM_STEP_*``) win over job values: a step may be smaller."""

    name = "slurm"
    VARS: ClassVar[dict[str, tuple[str, ...]]] = {
        "rank": ("SLURM_PROCID",), "local_rank": ("SLURM_LOCALID",),
        "world_size": ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
        "node_rank": ("SLURM_NODEID",),
        # srun sets SLURM_NNODES to the step's node count; SLURM_JOB_NUM_NODES is the job's
        "num_nodes": ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
        "tasks_per_node": ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
        "nodelist": ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
        "job_id": ("SLURM_JOB_ID", "SLURM_JOBID"), "step_id": ("SLURM_STEP_ID", "SLURM_STEPID"),
    }
    MPI_SIZES: ClassVar[tuple[str, ...]] = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")

    @classmethod
    def _get(cls, environ: Mapping[str, str], key: str) -> tuple[str | None, str]:
        for name in cls.VARS[key]:
            value = environ.get(name, "").strip()
            if value:
                return value, name
        return None, cls.VARS[key][0]

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> Placement | None:
        job_id, _ = cls._get(environ, "job_id")
        if job_id is None or "SLURM_PROCID" not in environ:
            return None
        step, _ = cls._get(environ, "step_id")
        if step is None:
            return cls._batch_step(environ, job_id)
        world, world_var = _first(environ, cls.VARS["world_size"], minimum=1)
        for mpi in cls.MPI_SIZES:  # mpirun inside a Slurm task: let the MPI detector answer
            size = environ.get(mpi, "").strip()
            if size and size != str(world):
                return None
        rank, rank_var = _first(environ, cls.VARS["rank"])
        local, local_var = _first(environ, cls.VARS["local_rank"])
        node, node_var = _first(environ, cls.VARS["node_rank"])
        if rank is None:  # SLURM_PROCID set but empty: not an srun task
            return None
        if world is None:
            raise DistEnvError(f"SLURM_PROCID is set but {world_var} is not",
                               "run the program with srun inside the allocation")
        local = rank if local is None else local
        node = 0 if node is None else node
        tpn_text, tpn_var = cls._get(environ, "tasks_per_node")
        if tpn_text is not None:
            tasks = parse_tasks_per_node(tpn_text, name=tpn_var)
        else:  # without a task list assume one node holds everything
            tasks = [world]
        nodes, nodes_var = _first(environ, cls.VARS["num_nodes"], minimum=1)
        if nodes is not None and nodes != len(tasks):
            raise DistEnvError(f"{tpn_var}={tpn_text} lists {len(tasks)} nodes but "
                               f"{nodes_var}={nodes}",
                               "the Slurm variables contradict each other: were they set by hand?")
        if sum(tasks) != world:
            raise DistEnvError(f"{world_var}={world} but {tpn_var}={tpn_text} sums to "
                               f"{sum(tasks)}",
                               "the world size must match the tasks per node: relaunch with srun "
                               "and matching --ntasks / --ntasks-per-node")
        if node >= len(tasks):
            raise DistEnvError(f"{node_var}={node} is not below {len(tasks)} nodes "
                               f"({tpn_var}={tpn_text})",
                               "the Slurm variables contradict each other")
        local_world = tasks[node]
        _check(rank=(rank, rank_var), world=(world, world_var), local=(local, local_var),
               local_world=(local_world, f"{tpn_var}[{node}]"), launcher=cls.name)
        nodelist, nodelist_var = cls._get(environ, "nodelist")
        addr = "127.0.0.1"
        extra: dict[str, str] = {"step_id": step}
        if nodelist is not None:
            # JUWELS wants rank 0's InfiniBand name (host name + 'i'): a generated script
            # exports that MASTER_ADDR, which wins below; `scaletrain lint` flags scripts without
            addr = first_host(nodelist)
            extra["nodelist"] = nodelist
        addr, port = _master(environ, addr, port_from_job_id(job_id))
        for key, name in (("cpus_per_task", "SLURM_CPUS_PER_TASK"),
                          ("gpus_on_node", "SLURM_GPUS_ON_NODE")):
            if environ.get(name):
                extra[key] = environ[name]
        return Placement(rank=rank, local_rank=local, world_size=world, local_world_size=local_world,
                   node_rank=node, num_nodes=len(tasks), master_addr=addr, master_port=port,
                   launcher=cls.name, job_id=job_id, extra=extra)

    @classmethod
    def _batch_step(cls, environ: Mapping[str, str], job_id: str) -> Placement:
        """The batch script itself (no srun): one process, whatever --ntasks asked for.

        Slurm exports SLURM_PROCID=0 and the job's SLURM_NTASKS into the batch step too; only
        srun tasks carry SLURM_STEP_ID. Treating the batch step as rank 0 of NTASKS would wait
        forever for peers that were never started, so it is a single process that remembers
        the job (``init()`` warns when more tasks were asked for).
        """
        extra = {"slurm_batch_step": "1"}
        ntasks = environ.get("SLURM_NTASKS", "").strip()
        if ntasks:
            extra["slurm_ntasks"] = ntasks
        addr, port = _master(environ, "127.0.0.1", port_from_job_id(job_id))
        return Placement(master_addr=addr, master_port=port, launcher="local", job_id=job_id,
                   extra=extra)


class _MpiEnv(Detector):
    """Shared logic for MPI launchers: ranks from a table; the address must come from somewhere."""

    RANK: ClassVar[tuple[str, ...]] = ()
    SIZE: ClassVar[tuple[str, ...]] = ()
    LOCAL_RANK: ClassVar[tuple[str, ...]] = ()
    LOCAL_SIZE: ClassVar[tuple[str, ...]] = ()
    JOB: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> Placement | None:
        rank, rank_var = _first(environ, cls.RANK)
        if rank is None:
            return None
        world, world_var = _first(environ, cls.SIZE, minimum=1)
        if world is None:
            raise DistEnvError(f"{rank_var}={rank} is set but no world size ({', '.join(cls.SIZE)})",
                               "launch with mpirun/mpiexec/srun so every rank knows the size")
        local, local_var = _first(environ, cls.LOCAL_RANK)
        local_world, local_world_var = _first(environ, cls.LOCAL_SIZE, minimum=1)
        if local is None or local_world is None:  # no per-node layout: assume one node
            local, local_var, local_world, local_world_var = rank, rank_var, world, world_var
        _check(rank=(rank, rank_var), world=(world, world_var), local=(local, local_var),
               local_world=(local_world, local_world_var), launcher=cls.name)
        # MPI maps ranks block-wise by node by default, so node = rank // ranks per node.
        nodes = -(-world // local_world)
        node = min(rank // local_world, nodes - 1)
        job = next((environ[n] for n in cls.JOB if environ.get(n)), None)
        slurm_job = environ.get("SLURM_JOB_ID") or None
        addr = "127.0.0.1"
        nodelist = environ.get("SLURM_JOB_NODELIST", "").strip()
        if nodes > 1 and nodelist:
            addr = first_host(nodelist)
        elif nodes > 1 and not environ.get("MASTER_ADDR", "").strip():
            raise DistEnvError(f"{world_var}={world} over {nodes} nodes but MASTER_ADDR is not set",
                               "export MASTER_ADDR=$(hostname) before mpirun and pass it to the "
                               "ranks (mpirun -x MASTER_ADDR)")
        port_key = slurm_job or job
        addr, port = _master(environ, addr, port_from_job_id(port_key) if port_key else DEFAULT_PORT)
        return Placement(rank=rank, local_rank=local, world_size=world, local_world_size=local_world,
                   node_rank=node, num_nodes=nodes, master_addr=addr, master_port=port,
                   launcher=cls.name, job_id=slurm_job or job)


class OpenMPIEnv(_MpiEnv):
    """Open MPI's mpirun/prterun (``OMPI_COMM_WORLD_*``)."""

    name = "openmpi"
    RANK = ("OMPI_COMM_WORLD_RANK",)
    SIZE = ("OMPI_COMM_WORLD_SIZE",)
    LOCAL_RANK = ("OMPI_COMM_WORLD_LOCAL_RANK",)
    LOCAL_SIZE = ("OMPI_COMM_WORLD_LOCAL_SIZE",)
    JOB = ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE")


class PMIEnv(_MpiEnv):
    """MPICH / Intel MPI (Hydra) and other PMI/PMIx launchers."""

    name = "pmi"
    RANK = ("PMI_RANK", "PMIX_RANK")
    SIZE = ("PMI_SIZE", "PMIX_SIZE")
    LOCAL_RANK = ("MPI_LOCALRANKID", "PALS_LOCAL_RANKID")
    LOCAL_SIZE = ("MPI_LOCALNRANKS", "PALS_LOCAL_SIZE")
    JOB = ("PMI_JOBID", "PMIX_NAMESPACE")


class LocalEnv(Detector):
    """No launcher: rank 0 of 1. A user's MASTER_ADDR/MASTER_PORT are kept for the record."""

    name = "local"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> Placement:
        addr, port = _master(environ, "127.0.0.1", DEFAULT_PORT)
        return Placement(master_addr=addr, master_port=port, launcher=cls.name)


# Fixed priority: torchrun runs inside Slurm jobs, and Slurm can start MPI programs.
DETECTORS: tuple[type[Detector], ...] = (TorchrunEnv, SlurmEnv, OpenMPIEnv, PMIEnv, LocalEnv)


def detect_placement(environ: Mapping[str, str] | None = None) -> Placement:
    """Who this process is in the job, from the first detector that recognises its launcher."""
    env_map: Mapping[str, str] = os.environ if environ is None else environ
    for detector in DETECTORS:
        found = detector.detect(env_map)
        if found is not None:
            return found
    return LocalEnv.detect(env_map)  # unreachable: LocalEnv always answers


# detect()'s one argument, declared in the settings vocabulary
ENVIRON = settings.Spec(doc="the variables to read, e.g. detect(dict(os.environ)); default os.environ",
                        check=settings.str_mapping(), optional=True)


def detect(environ: Mapping[str, str] | None = None) -> Env:
    """This process's :class:`Env`, read from the launcher's variables, without side effects.

    ``environ`` defaults to ``os.environ`` (read, never written). The device and backend come
    from the resolve step ``init()`` uses, with GPUs counted from the visible-GPU variables
    and device nodes instead of torch (no torch import); ``init()`` differs only where torch
    sees otherwise. Raises :class:`DistEnvError` when the variables contradict each other.
    """
    env_map: Mapping[str, str] = os.environ if environ is None else settings.check_value(ENVIRON, environ,
                                                                                          "detect(): environ")
    placement = detect_placement(env_map)
    request = read_request(env_map)
    device = choose_device(placement, request, gpu_view(env_map))
    return placement.with_device(device=device, backend=choose_backend(request, device))
