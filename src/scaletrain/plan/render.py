"""``render_script(plan)``: the Slurm batch script (or, without Slurm, a bash script) as text.

Pure: a Plan in, a string out, reading nothing but the Plan (the planner decided everything).
Every value was checked when the request was made (``JobRequest``); here each is quoted on the
way out (``scaletrain.plan.values``): ``#SBATCH`` values for sbatch's reader, shell words with ``shlex.quote``. Values that must be evaluated on
each node (``$SLURM_NODEID``) sit inside single quotes of a fixed ``bash -c`` program, and the
user's arguments reach that program as positional parameters (``"$@"``), so nothing the user
typed is ever re-parsed.
"""

from __future__ import annotations

import shlex

from scaletrain._version import __version__

# one formula for MASTER_PORT and the variable names, shared with the runtime and lint
from scaletrain.contract.environ import (CLUSTER_VAR, DATA_VAR, EXIT_STOPPED, PORT_SHELL_EXPR, PREEMPT_SIGNAL,
                                         SAVE_AND_STOP_SIGNAL, TIME_LIMIT_SIGNAL)
from scaletrain.contract.script import GENERATED_BY, trap_line
from scaletrain.errors import DistEnvError
from scaletrain.plan.jobfiles import folder_word
from scaletrain.plan.jobfiles import shell_lines as job_file_lines
from scaletrain.plan.launchers import spec
from scaletrain.plan.planner import Plan, StagePlan
from scaletrain.plan.values import sbatch_line
from scaletrain.slurm.parse import SRUN_DROPS_CPUS_PER_TASK

q = shlex.quote
EXIT_ENV = DistEnvError.exit_code   # 3: the environment is not what the job needs
MISSING = ("scaletrain: {py} cannot import scaletrain. Make an environment on the PyTorch of the cluster "
           "(scaletrain env create --cluster {cluster} DIR, on its login node) and pass --venv DIR; "
           "see docs/clusters.md")
NO_RUNTIME = ("scaletrain: {runtime} is not on PATH on this node, so the container cannot start "
              "(the set-up should provide it: a module of {cluster} that provides containers); see docs/clusters.md")
NO_PYTHON = ("scaletrain: {py} is not on PATH after the set-up: a module load or environment above did not "
             "give the job its Python (check the module names, or pass --module/--venv); see docs/clusters.md")


def _comment_safe(text: str) -> str:
    # A newline inside an argument must not end the comment line of the header.
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _header(plan: Plan) -> list[str]:
    command = shlex.join(plan.command) if plan.command else "(library call: make_plan/render_script)"
    procs = f"{plan.world_size} process{'es' if plan.world_size != 1 else ''}"
    gpus = (f" x {plan.gpus_per_node} GPU{'s' if plan.gpus_per_node != 1 else ''}"
            if plan.requests_gpus else " without GPUs")   # what the #SBATCH lines ask
    what = f"{plan.nodes} node{'s' if plan.nodes != 1 else ''}{gpus}, {procs}, launcher {plan.launcher}"
    if plan.scheduler != "slurm":
        what = f"{plan.world_size} CPU worker process{'es' if plan.world_size != 1 else ''} on this machine"
    lines = [
        "#!/bin/bash",
        GENERATED_BY.format(version=__version__, cluster=_comment_safe(plan.cluster))
        + (f" (partition {plan.partition})" if plan.partition else ""),
        f"# command: {_comment_safe(command)}",
        f"# job: {what}",
    ]
    # every value quoted for sbatch's own #SBATCH reader (checked when the request was made)
    lines += [sbatch_line(k, v) for k, v in plan.sbatch]
    return lines


def _setup(plan: Plan) -> list[str]:
    out = ["", "# Strict mode. Module scripts are not written for 'nounset': -u comes after the set-up.",
           "set -eo pipefail", ""]
    if plan.setup:
        out.append(f"# software set-up ({_comment_safe(plan.cluster)} profile, --module/--venv/--setup)")
        out.extend(plan.setup)
    out.append("set -u")
    return out + _guards(plan)


def _fail(test: str, message: str) -> str:
    return f"{test} || {{ echo {q(message)} >&2; exit {EXIT_ENV}; }}"


def _guards(plan: Plan) -> list[str]:
    """Stop before the launch, with the real cause, when the job's software is not there.

    In order: the container runtime (a missing ``singularity`` is not "cannot import"; a
    missing image the runtime reports itself), the Python the set-up should give (a module that did not load), then scaletrain.
    """
    out: list[str] = []
    cluster = _comment_safe(plan.cluster)
    if plan.container and plan.scheduler == "slurm":
        runtime = plan.container.split()[0]
        out += ["# the container runtime, before anything runs in the image",
                _fail(f"command -v {q(runtime)} >/dev/null 2>&1", NO_RUNTIME.format(runtime=runtime, cluster=cluster))]
    if not plan.check_scaletrain:
        return out
    py = f"{plan.container}{plan.python}"
    out.append("# this job imports scaletrain: stop here, with the fix, if the job's Python lacks it")
    if not plan.container:
        out.append(_fail(f"command -v {plan.python} >/dev/null 2>&1", NO_PYTHON.format(py=plan.python)))
    out.append(f"{py} -c 'import scaletrain' 2>/dev/null || {{ echo "
               f"{q(MISSING.format(py=py.strip(), cluster=cluster))} >&2; exit {EXIT_ENV}; }}")
    return out


def _environment(plan: Plan) -> list[str]:
    out = ["", f"# environment: the cluster ({CLUSTER_VAR}, for scaletrain's tools in the job) "
           "and what the runtime needs from its profile"]
    out += [f"export {k}={q(v)}" for k, v in plan.env]
    if plan.scheduler == "slurm":
        out += _srun_cpus(plan) + [
            "# rendezvous: the first node of the allocation, a port derived from the job id",
            "# (the same formula scaletrain.init uses, so every task agrees without talking)",
            # the suffix goes after the closing double quote: inside it, $(...) in a value would run
            'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"'
            + (q(plan.master_addr_suffix) if plan.master_addr_suffix else ""),
            "export MASTER_ADDR",
            f"export MASTER_PORT={PORT_SHELL_EXPR}",
        ]
    return out


def _srun_cpus(plan: Plan) -> list[str]:
    """The export that hands sbatch's --cpus-per-task to srun, where the planner kept it."""
    if not plan.srun_cpus_export:
        return []
    first, restored = (f"{major}.{month:02d}" for major, month in SRUN_DROPS_CPUS_PER_TASK)
    return [f"# Slurm {first} until {restored}: srun does not inherit --cpus-per-task from sbatch "
            f"({restored} restored it; elsewhere this line is harmless)",
            'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"']


def _stage(plan: Plan, stage: StagePlan) -> list[str]:
    dest = f'{stage.scratch_var}/{stage.dest_name}'
    src = q(stage.source)
    if stage.kind == "dir":
        body = 'mkdir -p "$1" && cp -r "$0"/. "$1"/'
    elif stage.kind == "zip":
        body = ('mkdir -p "$1" && if command -v unzip >/dev/null; then unzip -q "$0" -d "$1"; '
                f'else {plan.python} -m zipfile -e "$0" "$1"; fi')
    else:
        flag = {"tar": "", "tar.gz": "z", "tar.bz2": "j", "tar.xz": "J"}[stage.kind]
        body = f'mkdir -p "$1" && tar -x{flag}f "$0" -C "$1"'
    # The destination is computed on each node: the scratch variable is only set there.
    lines = ["", f"# stage the data to node-local scratch, once per node ({stage.kind})",
             f'export {DATA_VAR}="{dest}"']
    if plan.scheduler == "slurm":
        lines.append(f'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" '
                     f'--ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {q(body)} {src} "${DATA_VAR}"')
    else:
        lines.append(f'bash -c {q(body)} {src} "${DATA_VAR}"')
    lines.append(f'echo "scaletrain: data staged to ${DATA_VAR}"')
    return lines


def launch_command(plan: Plan) -> str:
    """The line that starts training (without the srun prefix on the local profile)."""
    if plan.scheduler != "slurm":
        return (f"{plan.container}{plan.python} -m scaletrain run --nproc-per-node {plan.procs_per_node} "
                f"{plan.program_words}")
    return spec(plan.launcher).build(plan)


def _launch(plan: Plan) -> list[str]:
    out = [""]
    if plan.launcher == "deepspeed" and plan.nodes > 1 and plan.scheduler == "slurm":
        # in the job's own folder (every node reads it), not loose in the working directory
        where = folder_word(slurm=True, folder=plan.files_dir)
        out += ["# DeepSpeed reads the nodes from a hostfile; each node starts its own workers (--no_ssh)",
                f'mkdir -p {where}',
                f"DS_HOSTFILE={where}/hostfile",
                f'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/$/ slots={plan.gpus_per_node}/" '
                '> "$DS_HOSTFILE"',
                "export DS_HOSTFILE"]
    if plan.scheduler != "slurm":
        out.append("# launch: worker processes on this machine (gloo on the CPU)")
        out.append(launch_command(plan))
        return out
    out.append(f"# launch: {spec(plan.launcher).comment}")
    if plan.nodes > 1 and "bash -c" in launch_command(plan):
        out.append("# (values in single quotes are evaluated on each node, not here)")
    if not plan.requeue:
        out.append(launch_command(plan))
        return out
    out += _requeue_block(plan)
    return out


def _requeue_block(plan: Plan) -> list[str]:
    """Launch in the background, relay stop signals, requeue only when the tasks saved.

    Slurm signals the batch shell: USR1 ``signal_seconds`` before the time limit (the
    header's ``--signal=B:USR1@N``), SIGTERM at a preemption. bash runs a trap only between
    commands, hence srun in the background and ``wait`` in a loop. srun relays both signals to
    every task; scaletrain.init() made them stop requests, so the tasks save at the next step
    and exit with EXIT_STOPPED, which srun passes on. Any other exit (a crash, a finished run)
    is not requeued, and SLURM_RESTART_COUNT bounds the loop.
    """
    bound = plan.max_requeues
    return [
        f"# --requeue: Slurm sends {TIME_LIMIT_SIGNAL} here {plan.signal_seconds} s before the time limit, "
        f"SIG{PREEMPT_SIGNAL} at a",
        "# preemption. srun relays them to every task, which saves at its next step and exits with",
        f"# {EXIT_STOPPED}; only then is the job put back in the queue (at most {bound} times).",
        '_scaletrain_stop() { echo "scaletrain: job $SLURM_JOB_ID got SIG$1; the tasks save and stop" >&2;',
        '  kill -"$1" "$SRUN_PID" 2>/dev/null || true; }',
        trap_line(TIME_LIMIT_SIGNAL),
        trap_line(PREEMPT_SIGNAL),
        f"# {SAVE_AND_STOP_SIGNAL} from 'scaletrain cancel --save': the tasks save and stop, and the job is not requeued",
        trap_line(SAVE_AND_STOP_SIGNAL, keep=True),   # what `scaletrain cancel --save` looks for
        f"{launch_command(plan)} &",
        "SRUN_PID=$!",
        "set +e",
        'while :; do wait "$SRUN_PID"; rc=$?; kill -0 "$SRUN_PID" 2>/dev/null || break; done',
        "set -e",
        f'if [ "$rc" -eq {EXIT_STOPPED} ] && [ -n "${{_scaletrain_keep:-}}" ]; then',
        '  echo "scaletrain: job $SLURM_JOB_ID saved and stopped on request; not requeued" >&2',
        f'elif [ "$rc" -eq {EXIT_STOPPED} ]; then',
        f'  if [ "${{SLURM_RESTART_COUNT:-0}}" -lt {bound} ]; then',
        '    echo "scaletrain: the tasks saved; requeueing job $SLURM_JOB_ID'
        f' (restart $((${{SLURM_RESTART_COUNT:-0}} + 1)) of {bound})" >&2',
        '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
        '    echo "scaletrain: scontrol requeue failed; submit the script again to resume" >&2',
        "  else",
        f'    echo "scaletrain: job $SLURM_JOB_ID was requeued {bound} times already; not again'
        ' (submit the script again to resume)" >&2',
        "  fi",
        "fi",
        'exit "$rc"',
    ]


def _sampler(plan: Plan) -> list[str]:
    """``--sample-gpus S``: one GPU sampler per node in the background, for ``scaletrain report``.

    ``--overlap`` lets the step share the job's CPUs, memory and GPUs with the training step
    (srun(1)); it asks for the node's GPUs so that device confinement lets NVML see them. The
    batch script's end ends it. A node where no GPU can be read gets one line saying why.
    """
    every = plan.sample_gpus
    if not every or plan.scheduler != "slurm":
        return []
    where = folder_word(slurm=True, folder=plan.files_dir)
    gres = f" --gres=gpu:{plan.gpus_per_node}" if plan.gpus_per_node else ""
    return ["", f"# --sample-gpus {every}: a GPU sampler per node in the background (NVML/AMD SMI), "
                "read by 'scaletrain report'",
            f'srun --overlap --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1'
            f"{gres} {plan.python} -m scaletrain.observe.nodesampler {where} --interval {int(every)} &"]


def render_script(plan: Plan) -> str:
    """The complete batch script for ``plan`` (ends with a newline)."""
    lines = _header(plan) + _setup(plan) + _environment(plan)
    if plan.stage is not None:
        lines += _stage(plan, plan.stage)
    lines += job_file_lines(plan.job_files, slurm=plan.scheduler == "slurm", folder=plan.files_dir)
    lines += _sampler(plan)
    lines += _launch(plan)
    return "\n".join(lines) + "\n"
