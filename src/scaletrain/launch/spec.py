"""What ``scaletrain run`` was asked for, and the validated plan the elastic agent runs.

``plan_launch`` is a pure function: the request, the environment and the GPU count in, a
``LaunchPlan`` out (or a ``UsageError`` with the fix). Nothing here imports torch or touches
``os.environ``; ``scaletrain.launch.local`` turns the plan into processes.

Rendezvous, deliberately:
- one node, nothing fixed: the "standalone" c10d rendezvous on ``localhost:0``; the store
  binds a kernel-chosen free port, so concurrent launches never collide;
- a ``MASTER_PORT`` (or ``--master-port``) given on one node, or several nodes: a static
  rendezvous at MASTER_ADDR:MASTER_PORT hosted by node rank 0, like torchrun's static mode;
- ``--emulate``: always the standalone rendezvous; the MASTER_ADDR/MASTER_PORT given are the
  program's (its rank 0 hosts its own store there, as under srun), checked free before start.
A user's ``MASTER_ADDR``/``MASTER_PORT`` is used as is; a flag that contradicts it is an error.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from scaletrain import settings
from scaletrain.contract.environ import (BACKEND_VAR, DEFAULT_PORT, EMULATE_VAR, PROCS_PER_GPU_VAR,
                                         TIMEOUT_VAR)
from scaletrain.errors import UsageError
from scaletrain.fileio import not_regular
from scaletrain.launch.inproc.emulate import MODES
from scaletrain.launch.teardown import Bounds, bounds
from scaletrain.launch.threads import ThreadBudget, thread_budget
from scaletrain.runtime.threads import allowed_cpus

# CPU workers per core beyond which a launch only thrashes (each worker is a whole Python
# process with torch loaded, ~300 MB): refused before anything is spawned.
WORKERS_PER_CORE = 4
MIN_WORKER_BOUND = 8
from scaletrain.launch.inproc.worker_shim import launcher_env
# Variables the runtime (scaletrain.init) reads; the launcher sets them only when asked.


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """The user's request, as given on the command line (values not yet checked)."""

    target: str                        # script path, or module name when ``module`` is True
    args: tuple[str, ...] = ()         # passed to the script verbatim
    module: bool = False
    nproc_per_node: int | str = "auto"  # an int, or "auto" = visible GPUs (1 without any)
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    max_restarts: int = 0
    ranks: str = "all"                 # "all": every rank's lines prefixed; "0": rank 0 only
    procs_per_gpu: int | None = None
    emulate: str | None = None         # "slurm"/"mpi": workers get srun's/mpirun's variables
    cpu: bool = False                  # CPU smoke test of a CUDA/NCCL program
    strict: bool = False               # exit non-zero when the workers never formed one group
    timeout_s: float | None = None     # collective timeout once training runs (workers)
    run_dir: str | None = None         # error records and hang stacks (default: temporary)


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """Everything the elastic agent needs, resolved and checked."""

    entrypoint: str                    # the Python interpreter
    args: tuple[str, ...]              # ``-u SCRIPT ARGS`` or ``-u -m MODULE ARGS``
    nproc_per_node: int
    nnodes: int
    node_rank: int
    rdzv_backend: str                  # "c10d" (one node, free port) or "static"
    rdzv_endpoint: str
    local_addr: str | None             # MASTER_ADDR given to workers on a single node
    master_port_fixed: int | None      # a port the user fixed; checked before launch
    max_restarts: int
    ranks: str
    threads: ThreadBudget
    gpus: int
    procs_per_gpu: int | None
    worker_env: dict[str, str] = field(default_factory=dict)  # added to each worker's environment
    emulate: str | None = None
    emulated_nodes: int = 1
    cpu: bool = False
    strict: bool = False
    run_dir: str | None = None
    teardown: Bounds = field(default_factory=Bounds)   # how long finished workers may take to exit

    def describe(self) -> str:
        """One line for the launcher's start-up message."""
        where = "standalone" if self.rdzv_backend == "c10d" else f"static {self.rdzv_endpoint}"
        nodes = f", node {self.node_rank}/{self.nnodes}" if self.nnodes > 1 else ""
        per_node = self.nproc_per_node
        if self.emulate:
            # the emulated nodes all run here: this launcher starts every one of their workers
            per_node = max(1, self.nproc_per_node // max(1, self.emulated_nodes))
            nodes += (f" x {self.emulated_nodes} emulated node(s) here ({self.emulate}), "
                      f"{self.nproc_per_node} in all")
        threads = f"{self.threads.per_worker} thread(s)" if self.threads.per_worker else "OpenMP's default threads"
        return (f"{per_node} worker(s) per node{nodes}, rendezvous {where}, "
                f"{threads} each ({self.threads.source})")


    def waiting_note(self) -> str | None:
        """On several real nodes, what the launcher now waits for and how the others join
        (the rendezvous blocks until every node's launcher has arrived, without output)."""
        if self.nnodes <= 1 or self.emulate:
            return None
        addr, _, port = self.rdzv_endpoint.rpartition(":")
        others = ", ".join(str(r) for r in range(self.nnodes) if r != self.node_rank)
        return (f"waiting for the other {self.nnodes - 1} node(s) (node rank {others}) at {addr}:{port}; "
                f"start each with the same program and: scaletrain run --nnodes {self.nnodes} "
                f"--node-rank R --master-addr {addr} --master-port {port} "
                f"--nproc-per-node {self.nproc_per_node}")


def _positive(name: str, value: int, hint: str) -> None:
    if value < 1:
        raise UsageError(f"{name} must be at least 1, got {value}", hint)


def _resolve_target(req: RunRequest) -> tuple[str, ...]:
    if req.module:
        top = req.target.split(".")[0]
        # find_spec on the top-level name imports nothing (a dotted name would import parents).
        if not top or importlib.util.find_spec(top) is None:
            raise UsageError(f"no module named {req.target!r}",
                             "check the name and that its package is installed or on PYTHONPATH")
        return ("-u", "-m", req.target, *req.args)
    if not os.path.isfile(req.target):
        kind = not_regular(req.target)
        if kind is not None:   # there, but a folder, a pipe or /dev/zero: "not found" would mislead
            raise UsageError(f"{req.target} is {kind}, not a script", "give the path of a Python file")
        hint = ("to run a module use -m NAME" if not req.target.endswith(".py")
                else "check the path (it is relative to the current directory)")
        raise UsageError(f"script not found: {req.target}", hint)
    return ("-u", req.target, *req.args)


def _check_worker_bound(nproc: int, flag: str, cores_here: int | None) -> None:
    """Refuse, before anything is spawned, more workers than this machine's cores can carry."""
    cores = cores_here if cores_here is not None else len(allowed_cpus())
    bound = max(MIN_WORKER_BOUND, WORKERS_PER_CORE * cores)
    if nproc > bound:
        raise UsageError(
            f"{flag} asks for {nproc} worker processes on {cores} core(s): they would only "
            f"thrash (at most {bound} here)",
            f"use --nproc-per-node {min(cores, bound)} (one per core) or a smaller "
            "--procs-per-gpu; for more ranks use more nodes (scaletrain plan)")


def _resolve_nproc(req: RunRequest, gpus: int, cores_here: int | None = None) -> int:
    devices = max(gpus, 1)  # without a GPU the CPU is the one "device"
    if req.procs_per_gpu is not None:
        _positive("--procs-per-gpu", req.procs_per_gpu, "use --procs-per-gpu 2 or more")
        wanted = devices * req.procs_per_gpu
        _check_worker_bound(wanted, "--procs-per-gpu", cores_here)
        if req.nproc_per_node != "auto" and int(req.nproc_per_node) != wanted:
            raise UsageError(
                f"--nproc-per-node {req.nproc_per_node} contradicts --procs-per-gpu "
                f"{req.procs_per_gpu} with {devices} device(s) ({wanted} processes)",
                "give only --procs-per-gpu K; the process count follows from it")
        return wanted
    if req.nproc_per_node == "auto":
        return devices
    try:
        nproc = int(req.nproc_per_node)
    except ValueError:
        raise UsageError(f"--nproc-per-node must be a number or 'auto', got {req.nproc_per_node!r}",
                         "e.g. --nproc-per-node 2") from None
    _positive("--nproc-per-node", nproc, "e.g. --nproc-per-node 2, or auto (one per GPU)")
    if not gpus:
        _check_worker_bound(nproc, "--nproc-per-node", cores_here)
    if gpus and nproc > gpus:
        raise UsageError(
            f"--nproc-per-node {nproc} is more than the {gpus} GPU(s) visible here",
            f"use --nproc-per-node {gpus} (or auto); to put several ranks on one GPU use "
            f"--procs-per-gpu K; to run on the CPU set CUDA_VISIBLE_DEVICES=''")
    return nproc


def _check_agrees(flag: str, flag_value: object, var: str, env: Mapping[str, str]) -> None:
    if flag_value is not None and var in env and str(flag_value) != env[var]:
        raise UsageError(f"{flag} {flag_value} contradicts {var}={env[var]} in the environment",
                         f"drop {flag} or unset {var}; scaletrain never overrides your {var}")


def _parse_port(value: str, where: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise UsageError(f"{where} must be a TCP port number (1-65535), got {value!r}",
                         "e.g. --master-port 29500")
    return int(value)


def plan_launch(req: RunRequest, *, environ: Mapping[str, str], gpus: int,
                cores: int | None = None) -> LaunchPlan:
    """Check ``req`` against the environment and return the plan, or raise UsageError.

    ``cores``: CPU cores this launcher may use (default: its affinity mask); bounds the
    number of CPU workers."""
    req = _emulation_from_environ(req, environ)
    emulated_nodes = _check_emulation(req)
    if req.emulate is not None:
        req = replace(req, nnodes=1)  # emulated nodes are local workers, not real nodes
    _check_flags(req, environ)
    teardown = bounds(environ)

    args = _resolve_target(req)
    nproc = _resolve_nproc(req, gpus, cores) * emulated_nodes
    if emulated_nodes > 1 and not gpus:   # the bound is on every worker started here
        _check_worker_bound(nproc, "--nnodes x --nproc-per-node", cores)
    backend, endpoint, local_addr, port = _rendezvous(req, environ)
    threads = thread_budget(nproc, environ)
    # an emulated job asked for one GPU per task (--cpu fakes one per worker)
    per_node = nproc // emulated_nodes
    emulated_gpus = per_node if req.cpu else min(gpus, per_node)
    worker_env = _worker_env(req, environ, threads, backend=backend, nodes=emulated_nodes,
                             gpus_per_node=emulated_gpus)

    return LaunchPlan(
        entrypoint=sys.executable, args=args, nproc_per_node=nproc, nnodes=req.nnodes,
        node_rank=req.node_rank, rdzv_backend=backend, rdzv_endpoint=endpoint,
        local_addr=local_addr,
        master_port_fixed=port if req.node_rank == 0 else None,
        max_restarts=req.max_restarts, ranks=req.ranks, threads=threads, gpus=gpus,
        procs_per_gpu=req.procs_per_gpu, worker_env=worker_env, emulate=req.emulate,
        emulated_nodes=emulated_nodes, cpu=req.cpu, strict=req.strict, run_dir=req.run_dir,
        teardown=teardown,
    )


def _check_flags(req: RunRequest, environ: Mapping[str, str]) -> None:
    """UsageError for a node count, node rank, restart count, timeout or ``--ranks`` out of
    range, or a master address/port that disagrees with the environment's."""
    _positive("--nnodes", req.nnodes, "e.g. --nnodes 2")
    if req.nnodes == 1 and req.node_rank != 0:
        raise UsageError("--node-rank needs --nnodes > 1", "e.g. --nnodes 2 --node-rank 1")
    if not 0 <= req.node_rank < req.nnodes:
        raise UsageError(f"--node-rank {req.node_rank} is outside 0..{req.nnodes - 1} "
                         f"for --nnodes {req.nnodes}",
                         "node ranks count from 0: give each node a distinct one below --nnodes")
    if req.max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more, got {req.max_restarts}",
                         "use 0 to fail at the first crash")
    if req.timeout_s is not None and not (0 < req.timeout_s < float("inf")):
        raise UsageError(f"--timeout must be a positive number of seconds, got {req.timeout_s:g}",
                         "e.g. --timeout 600 (a collective waiting longer ends the run)")
    if req.ranks not in ("all", "0"):
        raise UsageError(f"--ranks must be 'all' or '0', got {req.ranks!r}", "e.g. --ranks 0")
    _check_agrees("--master-addr", req.master_addr, "MASTER_ADDR", environ)
    _check_agrees("--master-port", req.master_port, "MASTER_PORT", environ)


def _rendezvous(req: RunRequest, environ: Mapping[str, str]
                ) -> tuple[str, str, str | None, int | None]:
    """``(backend, endpoint, local_addr, port)``: one node with no port given, or an emulation,
    picks a free port (c10d); otherwise a static rendezvous at node rank 0's address."""
    addr = req.master_addr or environ.get("MASTER_ADDR") or None
    port: int | None = None
    if req.master_port is not None:
        port = _parse_port(str(req.master_port), "--master-port")
    elif environ.get("MASTER_PORT"):
        port = _parse_port(environ["MASTER_PORT"], "MASTER_PORT")

    if req.emulate is not None:
        # Every emulated node runs here, and the address and port are the program's (a batch
        # script's exports, which the shim keeps): the agent's own store binds a free port
        # elsewhere, so rank 0 of the program can host its store where it was told to.
        backend, endpoint, local_addr = "c10d", "localhost:0", None
    elif req.nnodes == 1 and port is None:
        backend, endpoint, local_addr = "c10d", "localhost:0", addr
    else:
        if req.nnodes > 1 and addr is None:
            raise UsageError(f"--nnodes {req.nnodes} needs the address of node rank 0",
                             "add --master-addr HOST (the same on every node), or set MASTER_ADDR")
        addr = addr or "127.0.0.1"
        port = port if port is not None else DEFAULT_PORT
        backend, endpoint, local_addr = "static", f"{addr}:{port}", None
        if req.max_restarts:
            # torch's static rendezvous keeps one store across restarts, and the restarted
            # workers read the previous attempt's addresses (pytorch/pytorch#135712).
            raise UsageError(
                "--max-restarts needs the single-node rendezvous with a port scaletrain picks",
                "on one node unset MASTER_PORT / drop --master-port; on several nodes restart the "
                "job from its checkpoint instead (torch's static rendezvous cannot restart)")
    return backend, endpoint, local_addr, port


def _worker_env(req: RunRequest, environ: Mapping[str, str], threads: ThreadBudget, *,
                backend: str, nodes: int, gpus_per_node: int) -> dict[str, str]:
    """The variables every worker gets on top of the launcher's environment."""
    worker_env: dict[str, str] = {}
    if not threads.user_set:
        worker_env["OMP_NUM_THREADS"] = str(threads.per_worker)
    if req.max_restarts and backend == "c10d":
        # Restarted workers must not share the agent's store with the failed attempt: its keys
        # would send them to dead peers (pytorch/pytorch#135712). Rank 0 then hosts a fresh store.
        worker_env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if req.timeout_s is not None:
        worker_env[TIMEOUT_VAR] = f"{req.timeout_s:g}"
    if req.procs_per_gpu is not None:
        # NCCL refuses two ranks on one device; gloo works (through CUDA MPS on a GPU).
        worker_env[BACKEND_VAR] = "gloo"
        worker_env[PROCS_PER_GPU_VAR] = str(req.procs_per_gpu)

    if req.master_port is not None:  # under an emulation the program's, as if exported
        environ = {**environ, "MASTER_PORT": str(req.master_port)}
    worker_env.update(launcher_env(environ=environ, emulate=req.emulate, nodes=nodes,
                                   gpus_per_node=gpus_per_node, cpu=req.cpu,
                                   job_id=str(100000 + os.getpid() % 900000)))
    return worker_env


# SCALETRAIN_EMULATE in the launcher's own environment: the same request as --emulate (the
# launcher passes it on to its workers, whose shim would otherwise act on a value no one checked)
EMULATE = settings.Spec(doc="the launcher whose variables the workers get, as --emulate does; "
                            f"unset {EMULATE_VAR} to run without an emulation",
                        check=settings.choice(MODES))


def _emulation_from_environ(req: RunRequest, environ: Mapping[str, str]) -> RunRequest:
    """``req`` with the emulation ``SCALETRAIN_EMULATE`` asks for; UsageError for a value that is
    none of :data:`MODES`, or one that contradicts ``--emulate``."""
    mode = settings.from_environ(EMULATE, environ, EMULATE_VAR)
    if mode is None:
        return req
    if req.emulate is not None and req.emulate != mode:
        raise UsageError(f"--emulate {req.emulate} disagrees with {EMULATE_VAR}={mode}",
                         f"drop one of them (unset {EMULATE_VAR}, or give --emulate {mode})")
    return replace(req, emulate=mode)


def _check_emulation(req: RunRequest) -> int:
    """The number of emulated nodes (1 without ``--emulate``); UsageError for bad combinations."""
    if req.emulate is None:
        return 1
    if req.emulate not in MODES:
        raise UsageError(f"--emulate {req.emulate!r} is not one of {', '.join(MODES)}",
                         "e.g. --emulate slurm for a program written for srun")
    _positive("--nnodes", req.nnodes, "e.g. --nnodes 2")
    if req.node_rank or req.master_addr:
        raise UsageError("--emulate runs every emulated node on this machine: --node-rank and "
                         "--master-addr do not apply",
                         "drop them; --nnodes M --nproc-per-node N starts M x N local workers")
    return req.nnodes
