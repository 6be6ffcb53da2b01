"""Rules about how the program is started: srun tasks, torchrun, DeepSpeed and Accelerate.

Two launch modes are valid under Slurm, and most mistakes mix them:
- one task per GPU: ``srun python train.py`` with ``--ntasks-per-node`` = GPUs per node;
- one task per node: ``srun torchrun --nproc-per-node=<GPUs per node> ...`` (or accelerate,
  or the deepspeed launcher), with ``--ntasks-per-node=1``.
"""

from __future__ import annotations

import re
from typing import Iterable

from scaletrain.lint.findings import ERROR, WARNING, Finding, LintContext, Step, finding, rule
# the releases whose srun leaves out sbatch's --cpus-per-task (one fact, shared with plan's script)
from scaletrain.slurm.parse import srun_drops_cpus_per_task

_LOCALHOSTS = {"localhost", "127.0.0.1", "0.0.0.0", "::1", "[::1]", "ip6-localhost"}


def step_nodes(ctx: LintContext, step: Step) -> int:
    """Nodes the srun step runs on (its -N, else the job's)."""
    if step.srun is not None and step.srun.srun is not None:
        n = ctx.resolve_int(step.srun.srun.options.get("nodes"))
        if n:
            return n
    return ctx.job.node_count


def step_tasks_per_node(ctx: LintContext, step: Step) -> int:
    """Tasks per node of the srun step (its -n/--ntasks-per-node, else the job's)."""
    if step.srun is not None and step.srun.srun is not None:
        opts = step.srun.srun.options
        tpn = ctx.resolve_int(opts.get("ntasks-per-node"))
        if tpn:
            return tpn
        n = ctx.resolve_int(opts.get("ntasks"))
        if n:
            return max(1, -(-n // step_nodes(ctx, step)))
    return ctx.job.tasks_per_node


def _uses_mps(ctx: LintContext) -> bool:
    # NVIDIA MPS shares one GPU between several processes on purpose (Alliance's MPS example)
    return "nvidia-cuda-mps-control" in ctx.script.text


def _launcher_name(step: Step) -> str:
    inv = step.invocation
    return {"torchrun": "torchrun", "scaletrain": "scaletrain run", "deepspeed": "the deepspeed launcher",
            "accelerate": "accelerate launch"}.get(inv.kind, inv.program)


# per-node process count option of each per-node launcher
_NPROC_OPTION = {"torchrun": "nproc_per_node", "scaletrain": "nproc_per_node", "deepspeed": "num_gpus"}


# Arguments of programs that start one process per GPU themselves (PyTorch's ImageNet example).
_SPAWN_ARGS = ("--multiprocessing-distributed", "--multiprocessing_distributed")


def _spawns_per_gpu(step: Step) -> bool:
    return any(w.value.split("=")[0] in _SPAWN_ARGS for w in step.invocation.args)


def _tensorflow_workers(ctx: LintContext) -> bool:
    """The script sets TF_CONFIG: a MultiWorkerMirroredStrategy worker drives every GPU of its node."""
    return any("TF_CONFIG" in line for line in ctx.script.lines)


def _gpus_used_elsewhere(ctx: LintContext, this: Step, gpn: int) -> bool:
    """Another step uses every GPU (a launcher, or one task per GPU): this one is a side job
    such as data preparation or evaluation, not the training."""
    for step in ctx.steps:
        if step is this or not step.under_srun:
            continue
        if step.invocation.is_launcher or (step.invocation.kind == "python"
                                           and step_tasks_per_node(ctx, step) >= gpn):
            return True
    return False


@rule("tasks-per-gpu", "one-task-per-GPU launch whose tasks per node differ from GPUs per node")
def tasks_per_gpu(ctx: LintContext) -> Iterable[Finding]:
    gpn = ctx.job.gpus_per_node
    if not gpn:
        return
    for step in ctx.steps:
        if step.invocation.kind != "python" or not step.under_srun or step.srun is None \
                or step.srun.srun is None:
            continue
        tpn = step_tasks_per_node(ctx, step)
        if tpn == gpn:
            continue
        line = ctx.option_line("ntasks-per-node", "ntasks")
        if tpn <= 1:
            if _spawns_per_gpu(step) or _gpus_used_elsewhere(ctx, step, gpn) or _tensorflow_workers(ctx):
                continue
            yield finding("tasks-per-gpu", WARNING, step.line,
                          f"srun starts one '{step.invocation.program}' per node on {gpn} GPUs per node: "
                          f"unless the program drives all {gpn} GPUs itself (model parallel) or "
                          f"starts a process per GPU, {gpn - 1} GPUs per node stay idle",
                          f"#SBATCH --ntasks-per-node={gpn} (one task per GPU), or start it with "
                          f"torchrun --nproc-per-node={gpn}")
            continue
        if tpn > gpn and not _uses_mps(ctx):
            yield finding("tasks-per-gpu", ERROR, line,
                          f"{tpn} tasks per node share {gpn} GPUs per node: srun starts one "
                          f"process per task (line {step.line}), so processes collide on a GPU",
                          f"#SBATCH --ntasks-per-node={gpn} (one task per GPU)")
        elif tpn < gpn:
            yield finding("tasks-per-gpu", WARNING, line,
                          f"{tpn} tasks per node for {gpn} GPUs per node: unless each process "
                          f"drives several GPUs itself, {gpn - tpn} GPUs per node stay idle",
                          f"#SBATCH --ntasks-per-node={gpn}")


@rule("torchrun-nproc", "torchrun (or scaletrain run, deepspeed --num_gpus) processes per node "
      "different from the GPUs per node")
def torchrun_nproc(ctx: LintContext) -> Iterable[Finding]:
    gpn = ctx.job.gpus_per_node
    if not gpn:
        return
    for step in ctx.steps:
        inv = step.invocation
        key = _NPROC_OPTION.get(inv.kind)
        if key is None or key not in inv.launcher_opts:
            continue
        raw = inv.launcher_opts[key]
        if raw in ("gpu", "auto", "cuda", "xpu"):
            continue
        nproc = ctx.resolve_int(raw)
        if nproc is None or nproc == gpn:
            continue
        line = inv.launcher_words[key].line
        flag = "--num_gpus" if key == "num_gpus" else "--nproc-per-node"
        if nproc > gpn:
            yield finding("torchrun-nproc", ERROR, line,
                          f"{_launcher_name(step)} starts {nproc} processes per node but the job has "
                          f"{gpn} GPUs per node", f"{flag}={gpn}")
        else:
            yield finding("torchrun-nproc", WARNING, line,
                          f"{_launcher_name(step)} starts {nproc} processes per node on {gpn} GPUs per "
                          f"node: {gpn - nproc} GPUs per node stay idle",
                          f"{flag}={gpn}, or ask for {nproc} GPUs per node")


@rule("launcher-tasks", "a per-node launcher started by a multi-task srun (N x N processes)")
def launcher_tasks(ctx: LintContext) -> Iterable[Finding]:
    for step in ctx.steps:
        if not step.invocation.is_launcher or not step.under_srun or step.srun is None \
                or step.srun.srun is None:
            continue
        tpn = step_tasks_per_node(ctx, step)
        if tpn > 1:
            name = _launcher_name(step)
            cpt = ctx.job.cpus_per_task
            # the one task keeps the CPUs of all the tasks it replaces, for its workers
            cpus = f" and --cpus-per-task={cpt * tpn} (the {tpn} tasks' CPUs, now one task's)" \
                if cpt and cpt > 0 else ""
            yield finding("launcher-tasks", ERROR, step.line,
                          f"{name} starts its own processes per node, but srun starts it {tpn} times "
                          f"per node ({tpn} x its processes)",
                          f"#SBATCH --ntasks-per-node=1{cpus} (or 'srun --ntasks-per-node=1 ...'), "
                          "or run the program with srun directly, one task per GPU")


@rule("launcher-cpus", "a per-node launcher whose one task has few CPUs for all its workers")
def launcher_cpus(ctx: LintContext) -> Iterable[Finding]:
    cpt, prof = ctx.job.cpus_per_task, ctx.profile
    if not cpt:
        return   # Slurm's or the partition's default: lint cannot tell how many
    for step in ctx.steps:
        key = _NPROC_OPTION.get(step.invocation.kind)
        if key is None or not step.under_srun or step_tasks_per_node(ctx, step) != 1:
            continue
        raw = step.invocation.launcher_opts.get(key)
        nproc = ctx.job.gpus_per_node if raw in ("gpu", "auto", "cuda") else ctx.resolve_int(raw)
        if not nproc or nproc < 2:
            continue
        share = prof.cores_per_gpu if prof is not None and prof.gpus_per_node else None
        # with the cluster's cores per GPU: under half of a GPU's share per worker; without:
        # fewer CPUs than workers, which no setting of the program can make up for
        if (share and cpt * 2 < nproc * share) or (not share and cpt < nproc):
            want = min(nproc * share, prof.cores_per_node) if share and prof else cpt * nproc
            why = (f"{prof.name}'s GPUs come with {share} cores each" if share and prof
                   else "fewer than one each")
            yield finding("launcher-cpus", WARNING, ctx.option_line("cpus-per-task"),
                          f"{_launcher_name(step)} (line {step.line}) starts {nproc} workers in one "
                          f"task of {cpt} CPUs ({cpt / nproc:g} each; {why}): their threads and "
                          "data-loader workers share those cores",
                          f"#SBATCH --cpus-per-task={want}")
            return


@rule("no-srun", "a multi-task or multi-node job whose program is not started by srun")
def no_srun(ctx: LintContext) -> Iterable[Finding]:
    job = ctx.job
    nodes, tasks = job.node_count, job.total_tasks
    launched = any(s.under_srun and s.invocation.is_program for s in ctx.steps)
    for step in ctx.steps:
        inv = step.invocation
        if step.via_shell or step.under_srun or not inv.is_program:
            continue
        if inv.kind == "python" and (tasks > 1 or nodes > 1):
            # with another program under srun, a bare python is likely set-up work (data prep)
            sev = WARNING if launched else ERROR
            yield finding("no-srun", sev, step.line,
                          f"'{inv.program}' runs once, on the first node only, but the job asks for "
                          f"{tasks} tasks on {nodes} node(s)",
                          f"srun {' '.join(w.value for w in step.invocation.command.words[:3])} ...")
        elif inv.is_launcher and nodes > 1:
            if inv.kind == "deepspeed" and "hostfile" in inv.launcher_opts:
                continue   # the deepspeed launcher reaches the other nodes itself (pdsh/ssh)
            yield finding("no-srun", ERROR, step.line,
                          f"{_launcher_name(step)} runs on the first node only, but the job has {nodes} nodes",
                          "start it with 'srun --ntasks-per-node=1 ...' so it runs once on every node")


@rule("torchrun-standalone", "multi-node torchrun with --standalone")
def torchrun_standalone(ctx: LintContext) -> Iterable[Finding]:
    for step in ctx.steps:
        inv = step.invocation
        if inv.kind not in ("torchrun", "scaletrain") or "standalone" not in inv.launcher_opts:
            continue
        if step_nodes(ctx, step) > 1:
            yield finding("torchrun-standalone", ERROR, inv.launcher_words["standalone"].line,
                          "--standalone makes each node its own 1-node job, but this step runs on "
                          f"{step_nodes(ctx, step)} nodes",
                          "drop --standalone; use --nnodes=$SLURM_NNODES --rdzv-backend=c10d "
                          "--rdzv-endpoint=$(hostname):29400 --rdzv-id=$SLURM_JOB_ID")


def _host(value: str) -> str:
    host = value.rsplit(":", 1)[0] if value.count(":") == 1 or value.startswith("[") else value
    return host.strip().lower()


@rule("rendezvous-localhost", "multi-node rendezvous at localhost")
def rendezvous_localhost(ctx: LintContext) -> Iterable[Finding]:
    hint = "use the first node's host name: MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"
    for step in ctx.steps:
        inv = step.invocation
        if step_nodes(ctx, step) <= 1:
            continue
        for key in ("rdzv_endpoint", "master_addr", "main_process_ip"):
            value = inv.launcher_opts.get(key)
            if value and _host(value) in _LOCALHOSTS:
                yield finding("rendezvous-localhost", ERROR, inv.launcher_words[key].line,
                              f"--{key}={value} on a {step_nodes(ctx, step)}-node job: the other nodes "
                              f"reach their own localhost and never meet", hint)
    if ctx.job.node_count > 1:
        for name in ("MASTER_ADDR", "RDZV_HOST"):
            for word, _cmd in ctx.variables.get(name, []):
                if not word.expansions and _host(word.value) in _LOCALHOSTS:
                    yield finding("rendezvous-localhost", ERROR, word.line,
                                  f"{name}={word.value} in a {ctx.job.node_count}-node job", hint)


@rule("launcher-nodes", "torchrun --nnodes / accelerate --num_machines different from the step's nodes")
def launcher_nodes(ctx: LintContext) -> Iterable[Finding]:
    for step in ctx.steps:
        inv = step.invocation
        key = {"torchrun": "nnodes", "scaletrain": "nnodes", "accelerate": "num_machines",
               "deepspeed": "num_nodes"}.get(inv.kind)
        if key is None or key not in inv.launcher_opts or not step.under_srun:
            continue
        raw = inv.launcher_opts[key] or ""
        if ":" in raw:          # elastic min:max
            continue
        n = ctx.resolve_int(raw)
        nodes = step_nodes(ctx, step)
        if n is not None and n != nodes:
            yield finding("launcher-nodes", ERROR, inv.launcher_words[key].line,
                          f"--{key}={raw} but srun starts it on {nodes} node(s): "
                          + ("the nodes form separate jobs" if n < nodes else "the rendezvous waits forever"),
                          f"--{key}=$SLURM_NNODES")


@rule("node-rank-missing", "multi-node static rendezvous without a per-node rank")
def node_rank_missing(ctx: LintContext) -> Iterable[Finding]:
    for step in ctx.steps:
        inv = step.invocation
        if not step.under_srun or step_nodes(ctx, step) <= 1:
            continue
        if inv.kind in ("torchrun", "scaletrain"):
            backend = (inv.launcher_opts.get("rdzv_backend") or "static").lower()
            if backend != "static" or "standalone" in inv.launcher_opts or "node_rank" in inv.launcher_opts:
                continue
            yield finding("node-rank-missing", ERROR, step.line,
                          f"multi-node {_launcher_name(step)} with static rendezvous but no --node-rank: "
                          "every node claims rank 0", "add --node-rank=\\$SLURM_NODEID inside 'srun bash -c \"...\"', "
                          "or use --rdzv-backend=c10d")
        elif inv.kind == "accelerate" and "machine_rank" not in inv.launcher_opts \
                and "num_machines" in inv.launcher_opts:
            yield finding("node-rank-missing", ERROR, step.line,
                          "multi-node accelerate launch without --machine_rank: every node claims rank 0",
                          "--machine_rank=\\$SLURM_NODEID inside 'srun bash -c \"...\"'")


@rule("accelerate-nproc", "accelerate --num_processes different from the job's GPUs")
def accelerate_nproc(ctx: LintContext) -> Iterable[Finding]:
    gpn = ctx.job.gpus_per_node
    if not gpn:
        return
    for step in ctx.steps:
        inv = step.invocation
        if inv.kind != "accelerate" or "num_processes" not in inv.launcher_opts:
            continue
        n = ctx.resolve_int(inv.launcher_opts["num_processes"])
        total = gpn * step_nodes(ctx, step)
        if n is None or n == total:
            continue
        line = inv.launcher_words["num_processes"].line
        if n > total:
            yield finding("accelerate-nproc", ERROR, line,
                          f"--num_processes={n} (the total over all nodes) but the job has {total} GPUs",
                          f"--num_processes={total}")
        else:
            yield finding("accelerate-nproc", WARNING, line,
                          f"--num_processes={n} on {total} GPUs: {total - n} stay idle",
                          f"--num_processes={total}")


@rule("ntasks-distribution", "multi-node --ntasks without --ntasks-per-node (Slurm may place tasks unevenly)")
def ntasks_distribution(ctx: LintContext) -> Iterable[Finding]:
    job = ctx.job
    if job.node_count <= 1 or not job.ntasks or job.ntasks <= 1 or job.ntasks_per_node is not None:
        return
    if ctx.script.option("gpus-per-task") is not None or ctx.script.option("ntasks-per-gpu") is not None:
        return   # each task brings its own GPU: a node takes no more tasks than it has GPUs
    nodes = job.node_count
    even = job.ntasks % nodes == 0
    yield finding("ntasks-distribution", WARNING, ctx.option_line("ntasks"),
                  f"--ntasks={job.ntasks} on {nodes} nodes without --ntasks-per-node: Slurm fills "
                  f"nodes by free cores and may place them unevenly (e.g. {job.ntasks - nodes + 1}+1...), "
                  "so one node's GPUs get more processes than it has",
                  f"#SBATCH --ntasks-per-node={job.ntasks // nodes}" if even else
                  f"use a multiple of {nodes} tasks and --ntasks-per-node")


@rule("omp-threads", "OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK shared by several launcher workers per task")
def omp_threads(ctx: LintContext) -> Iterable[Finding]:
    entries = [w for w, _c in ctx.variables.get("OMP_NUM_THREADS", [])]
    whole = [w for w in entries
             if re.fullmatch(r"\$\{?SLURM_CPUS_PER_TASK(:-\d+)?\}?", w.raw.strip("\"'"))]
    if not whole or len(entries) != len(whole):
        return
    for step in ctx.steps:
        key = _NPROC_OPTION.get(step.invocation.kind)
        if key is None:
            continue
        raw = step.invocation.launcher_opts.get(key)
        nproc = ctx.job.gpus_per_node if raw in ("gpu", "auto", "cuda") else ctx.resolve_int(raw)
        if nproc and nproc > 1:
            yield finding("omp-threads", WARNING, whole[0].line,
                          f"OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK gives each of the {nproc} "
                          f"{_launcher_name(step)} workers (line {step.line}) all of the task's cores: "
                          f"{nproc} x oversubscribed",
                          f"OMP_NUM_THREADS=$((SLURM_CPUS_PER_TASK / {nproc}))")
            return


@rule("no-launch", "no line that starts a program (srun, mpirun, python or a launcher)")
def no_launch(ctx: LintContext) -> Iterable[Finding]:
    if any(s.invocation.is_program or s.srun is not None for s in ctx.steps):
        return
    if not ctx.script.options or re.search(r"^<{7}", ctx.script.text, re.M):
        return   # not a job script, or a merge conflict hides the commands (merge-conflict says so)
    last = ctx.script.commands[-1].line if ctx.script.commands else ctx.script.header_end
    yield finding("no-launch", WARNING, min(last, len(ctx.script.lines)),
                  "no srun, mpirun, python or launcher line: the job allocates its nodes and runs "
                  "nothing on them (or calls a wrapper lint cannot see)",
                  "add the launch line, e.g. srun python train.py (or lint the wrapper it calls)")


@rule("srun-cpus-per-task", "srun under #SBATCH --cpus-per-task>1 without SRUN_CPUS_PER_TASK or srun "
      "--cpus-per-task, on a cluster that runs Slurm 22.05 to 23.02 (its srun gives each task one CPU)")
def srun_cpus_per_task(ctx: LintContext) -> Iterable[Finding]:
    cpt = ctx.job.cpus_per_task
    prof = ctx.profile
    # an unknown cluster or an unknown Slurm release: no warning (most clusters run 23.11 or later)
    if prof is None or not srun_drops_cpus_per_task(prof.slurm_version):
        return
    if not cpt or cpt < 2 or ctx.variables.get("SRUN_CPUS_PER_TASK"):
        return
    for step in ctx.steps:
        call = step.srun.srun if step.srun is not None else None
        if call is None or not step.invocation.is_program or "cpus-per-task" in call.options:
            continue
        if any(name == "SRUN_CPUS_PER_TASK" for name, _ in step.srun.command.assignments):  # type: ignore[union-attr]
            continue   # SRUN_CPUS_PER_TASK=7 srun ...: given to this srun alone
        yield finding("srun-cpus-per-task", WARNING, step.line,
                      f"#SBATCH --cpus-per-task={cpt} does not reach this srun: {prof.name} runs Slurm "
                      f"{prof.slurm_version}, whose srun does not inherit it (22.05 to 23.02; 23.11 restored "
                      "it), so each task gets 1 CPU and its threads and data-loader workers share that one core",
                      "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK before srun (or srun "
                      "--cpus-per-task=$SLURM_CPUS_PER_TASK)")
        return
