"""The launcher table: one ``LauncherSpec`` per launch mode, the only place its facts live.

A spec says how many Slurm tasks a node runs (one per GPU, or one per node that starts a worker
per GPU itself), whether the job needs scaletrain importable on the cluster, what the program
must read to find its rank, the comment the script carries, and how the launch line is built.
The planner reads ``per_node``; the renderer calls ``build(facts)``; the CLI lists ``describe``.

Launch lines read only a plan's launch facts (never the profile or the request), which the renderer
gathers from the records into ``LaunchFacts``, so that this module imports nothing of the planner.
Values evaluated on each node (``$SLURM_NODEID``) sit in the single-quoted program of a ``bash -c``,
and the user's words reach it as ``"$@"``, so nothing the user typed is parsed twice.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable

q = shlex.quote


@dataclass(frozen=True, kw_only=True)
class LaunchFacts:
    """What a launch line reads of a plan, gathered from its records by the renderer."""

    nodes: int
    procs_per_node: int
    world_size: int
    device: str
    cpu_bind: str | None
    container: str
    python: str
    exec_wrapper: str | None
    program_words: str
    accelerate_config: str | None


@dataclass(frozen=True)
class LauncherSpec:
    """How one launch mode lays out tasks and starts the program."""

    name: str
    per_node: bool          # one Slurm task per node (it starts the workers); else one task per GPU
    needs_scaletrain: bool  # the job imports scaletrain: the script checks for it before launching
    program_reads: str      # what the training program reads to find its rank (help, docs)
    comment: str            # the "# launch:" comment in the script
    build: Callable[[LaunchFacts], str]
    # --requeue needs the USR1 to reach the workers and their exit code 75 to reach srun; a third-
    # party per-node agent dies of the USR1 and exits 1 when its workers stop on purpose
    requeue_ok: bool = True
    # the task is its node's only process and drives every GPU itself (TensorFlow's worker)
    one_process: bool = False


def srun_prefix(plan: LaunchFacts) -> str:
    """``srun`` with the plan's binding; every task ends if one fails."""
    srun = "srun --kill-on-bad-exit=1"
    if plan.cpu_bind:
        srun += f" --cpu-bind={plan.cpu_bind}"
    return srun


def _per_node(plan: LaunchFacts, inner: str) -> str:
    """Run ``inner`` (fixed text, evaluated on each node) with the user's words as "$@"."""
    return f"{srun_prefix(plan)} bash -c {q(inner)} bash {plan.program_words}"


def _python(plan: LaunchFacts) -> str:
    return f"{srun_prefix(plan)} {plan.container}{plan.python} -u {plan.program_words}"


def _srun_env(plan: LaunchFacts) -> str:
    inner = ('export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS" '
             f'LOCAL_WORLD_SIZE={plan.procs_per_node}; exec {plan.container}{plan.python} -u "$@"')
    return _per_node(plan, inner)


def _torchrun(plan: LaunchFacts) -> str:
    # As the centres' guides write it: torch's own launcher, nothing of scaletrain needed.
    # Several nodes meet by c10d rendezvous on the first node; torchrun numbers them itself.
    run = f"{plan.container}{plan.python} -m torch.distributed.run"
    g = plan.procs_per_node
    if plan.nodes == 1:
        return f"{srun_prefix(plan)} {run} --standalone --nnodes=1 --nproc_per_node={g} {plan.program_words}"
    return (f'{srun_prefix(plan)} {run} --nnodes={plan.nodes} --nproc_per_node={g} '
            f'--rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" '
            f"{plan.program_words}")


def _scaletrain_run(plan: LaunchFacts) -> str:
    run = f"{plan.container}{plan.python} -m scaletrain run"
    g = plan.procs_per_node
    if plan.nodes == 1:
        return f"{srun_prefix(plan)} {run} --nproc-per-node {g} {plan.program_words}"
    inner = (f'exec {run} --nnodes {plan.nodes} --node-rank "$SLURM_NODEID" '
             f'--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" --nproc-per-node {g} "$@"')
    return _per_node(plan, inner)


def _accelerate(plan: LaunchFacts) -> str:
    n, g = plan.nodes, plan.procs_per_node
    if plan.accelerate_config:
        # the config (the user's, or the one the job wrote) decides the strategy (FSDP, DeepSpeed,
        # ...); the flags below give only the layout. The value is already a shell word.
        extra = f" --config_file={plan.accelerate_config}"
    else:
        # on the CPU too: ACCELERATE_USE_CPU (exported by the plan) makes it MULTI_CPU
        extra = " --multi_gpu" if plan.world_size > 1 else (" --cpu" if plan.device == "cpu" else "")
    run = f"{plan.container}accelerate launch{extra}"
    if n == 1:
        return (f"{srun_prefix(plan)} {run} --num_processes={g} --num_machines=1 "
                f'--machine_rank=0 --main_process_port="$MASTER_PORT" {plan.program_words}')
    inner = (f"exec {run} --num_processes={n * g} --num_machines={n} "
             '--machine_rank="$SLURM_NODEID" --main_process_ip="$MASTER_ADDR" '
             '--main_process_port="$MASTER_PORT" --rdzv_backend=static "$@"')
    return _per_node(plan, inner)


def _deepspeed(plan: LaunchFacts) -> str:
    n, g = plan.nodes, plan.procs_per_node
    wrap = f"{plan.exec_wrapper} " if plan.exec_wrapper and not plan.container else plan.container
    if n == 1:
        return f'{srun_prefix(plan)} {wrap}deepspeed --num_gpus={g} --master_port="$MASTER_PORT" {plan.program_words}'
    inner = (f'exec {wrap}deepspeed --hostfile="$DS_HOSTFILE" --no_ssh --node_rank="$SLURM_NODEID" '
             f'--num_nodes={n} --num_gpus={g} --master_addr="$MASTER_ADDR" '
             '--master_port="$MASTER_PORT" "$@"')
    return _per_node(plan, inner)


def _tensorflow(plan: LaunchFacts) -> str:
    # TF_CONFIG lists every node; each task finds its own index (SLURM_PROCID), so it is computed
    # on the node, by bash alone: the job's Python (the centre's TensorFlow) needs no scaletrain.
    from scaletrain.frameworks.tensorflow import TASK_SHELL

    return _per_node(plan, f'{TASK_SHELL}; exec {plan.container}{plan.python} -u "$@"')


_SPECS = (
    LauncherSpec("scaletrain", False, True, "Slurm's variables, through scaletrain.init()",
                 "one task per GPU; scaletrain.init() reads Slurm's variables", _python),
    LauncherSpec("torchrun", True, False, "RANK, LOCAL_RANK, WORLD_SIZE, set by torchrun",
                 "one task per node; torchrun (torch.distributed.run) starts a worker per GPU", _torchrun,
                 requeue_ok=False),
    LauncherSpec("scaletrain-run", True, True, "RANK, LOCAL_RANK, WORLD_SIZE, set by scaletrain run",
                 "one task per node; scaletrain run starts a worker per GPU", _scaletrain_run),
    LauncherSpec("srun", False, False, "RANK, LOCAL_RANK, WORLD_SIZE, set from SLURM_PROCID/LOCALID/NTASKS",
                 "one task per GPU with torch's env:// variables set from Slurm's", _srun_env),
    LauncherSpec("lightning", False, False, "Slurm's variables, through Lightning's SLURMEnvironment",
                 "one task per GPU; Lightning reads Slurm's variables", _python),
    LauncherSpec("accelerate", True, False, "what accelerate launch sets (RANK, LOCAL_RANK, WORLD_SIZE)",
                 "one task per node; accelerate launch starts a worker per GPU", _accelerate,
                 requeue_ok=False),
    LauncherSpec("deepspeed", True, False, "LOCAL_RANK, set by the deepspeed launcher",
                 "one task per node; the deepspeed launcher starts a worker per GPU", _deepspeed,
                 requeue_ok=False),
    LauncherSpec("tensorflow", True, False, "TF_CONFIG, built for each task from the allocation",
                 "one task per node, driving all its GPUs; TF_CONFIG lists every node as a "
                 "MultiWorkerMirroredStrategy worker", _tensorflow, requeue_ok=False, one_process=True),
    LauncherSpec("mpi", False, False, "the MPI rank (SLURM_PROCID under srun)",
                 "one task per GPU (MPI-style: rank = SLURM_PROCID)", _python),
)
SPECS: dict[str, LauncherSpec] = {s.name: s for s in _SPECS}
LAUNCHERS: tuple[str, ...] = tuple(SPECS)


def spec(name: str) -> LauncherSpec:
    """The spec of launcher ``name`` (KeyError for an unknown one; the planner validates first)."""
    return SPECS[name]


def describe() -> str:
    """One help line per launcher: name, tasks per node, what the program reads."""
    return "\n".join(f"  {s.name:<15}{'one task per node' if s.per_node else 'one task per GPU'}; "
                     f"the program reads {s.program_reads}" for s in _SPECS)
