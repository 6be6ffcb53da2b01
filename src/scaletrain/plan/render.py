"""Stage 5, render: ``render_script(plan)``, the Slurm batch script (or, without Slurm, a bash
script) as text.

Pure: a Plan in, a string out, reading nothing but the Plan's records (the stages decided
everything); this module imports the records and text helpers only (a test holds to it).
Every value was checked when the request was made (``JobRequest``); here each is quoted on the
way out (``scaletrain.plan.values``): ``#SBATCH`` values for sbatch's reader, shell words with
``shlex.quote``. Values that must be evaluated on each node (``$SLURM_NODEID``) sit inside single
quotes of a fixed ``bash -c`` program, and the user's arguments reach that program as positional
parameters (``"$@"``), so nothing the user typed is ever re-parsed.
"""

from __future__ import annotations

import shlex

from scaletrain._version import __version__
from scaletrain.clusters.model import ClusterProfile
# one formula for MASTER_PORT and the variable names, shared with the runtime and lint
from scaletrain.contract.environ import (CLUSTER_VAR, DATA_VAR, DEEPSPEED_CONFIG_VAR, EXIT_STOPPED, JOB_FILES_VAR,
                                         LIGHTNING_DEEPSPEED_VAR, PORT_SHELL_EXPR, PREEMPT_SIGNAL,
                                         SAVE_AND_STOP_SIGNAL, TIME_LIMIT_SIGNAL)
from scaletrain.contract.files import JOB_LOG
from scaletrain.contract.script import GENERATED_BY, HEREDOC_END, SCRATCH_PLACEHOLDER, trap_line
from scaletrain.errors import DistEnvError
from scaletrain.plan.launchers import LaunchFacts, spec
from scaletrain.plan.records import JobFile, Plan, StagePlan
from scaletrain.plan.request import JOB_OPTIONS
from scaletrain.plan.values import program_words, sbatch_line
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


def render_script(plan: Plan) -> str:
    """The complete batch script for ``plan`` (ends with a newline)."""
    slurm = plan.settled.profile.scheduler == "slurm"
    lines = _header(plan) + _setup(plan) + _environment(plan)
    if plan.resources.stage is not None:
        lines += _stage(plan, plan.resources.stage)
    lines += _job_files(plan.files.job_files, slurm=slurm, folder=plan.settled.request.files_dir)
    lines += _sampler(plan)
    lines += _launch(plan)
    return "\n".join(lines) + "\n"


def launch_command(plan: Plan) -> str:
    """The line that starts training (without the srun prefix on the local profile)."""
    facts = _launch_facts(plan)
    if plan.settled.profile.scheduler != "slurm":
        return (f"{facts.container}{facts.python} -m scaletrain run --nproc-per-node {facts.procs_per_node} "
                f"{facts.program_words}")
    return spec(plan.settled.request.launcher).build(facts)


def setup_lines(plan: Plan) -> tuple[str, ...]:
    """The script's set-up, in order: the lines that make the job's Python, the MPS daemon's, the
    user's ``--setup`` lines."""
    return (*plan.software.setup, *plan.software.mps, *plan.settled.request.setup)


def exports(plan: Plan) -> tuple[tuple[str, str], ...]:
    """The variables the script exports before the launch, in order: the user's own config files'
    (files stage), then ours, the profile's and ``--env`` (software stage)."""
    return (*plan.files.env, *plan.software.env)


def program_line(plan: Plan) -> str:
    """The program and its arguments as shell words, then the words the files stage adds."""
    request = plan.settled.request
    words = program_words(request.script, request.script_args, expand=request.expand_args)
    return " ".join((words, *plan.files.program_extra))


def _launch_facts(plan: Plan) -> LaunchFacts:
    res, sw = plan.resources, plan.software
    return LaunchFacts(nodes=res.nodes, procs_per_node=res.procs_per_node, world_size=res.world_size,
                       device=res.device, cpu_bind=res.cpu_bind, container=sw.container, python=sw.python,
                       exec_wrapper=sw.exec_wrapper, program_words=program_line(plan),
                       accelerate_config=plan.files.accelerate_config)


def gpu_options(profile: ClusterProfile, *, gpn: int, gpus_per_task: int,
                disk: str | None) -> list[tuple[str, str]]:
    """The GPU request in the cluster's syntax, with node-local disk when it is a GRES."""
    kind = profile.gpu_request
    if profile.gpus_per_node == 0 or gpn == 0:
        return [("gres", disk)] if disk else []
    if kind == "gres_typed":
        return [("gres", f"gpu:{profile.gres_type}:{gpn}" + (f",{disk}" if disk else ""))]
    if kind == "gres":
        return [("gres", f"gpu:{gpn}" + (f",{disk}" if disk else ""))]
    if kind == "gpus_per_node_typed":   # the Alliance's H100/A100 clusters: --gpus-per-node=h100:N
        return [("gpus-per-node", f"{profile.gres_type}:{gpn}")] + ([("gres", disk)] if disk else [])
    out = [("gpus-per-task", str(gpus_per_task)) if kind == "gpus_per_task" else ("gpus-per-node", str(gpn))]
    return out + ([("gres", disk)] if disk else [])


def sbatch_options(plan: Plan) -> tuple[tuple[str, str], ...]:
    """The ``#SBATCH`` options, ordered (option, value) pairs; value "" is a bare flag.

    The layout options come from the ``Allocation``, the GPU ask in the cluster's syntax
    (:func:`gpu_options`), node-local disk (staged data, DeepSpeed's NVMe offload) where the cluster
    sells it as a GRES; the job options (mail, array, constraint, dependency, reservation, QOS, log
    names, working directory) from their own flags; anything else from ``--sbatch OPTION[=VALUE]``
    (whose names were checked when the request was made, ``scaletrain.plan.values.COMPUTED``).
    """
    request, profile, res = plan.settled.request, plan.settled.profile, plan.resources
    if profile.scheduler != "slurm":
        return ()
    lines: list[tuple[str, str]] = [("job-name", plan.settled.request.slurm_job_name)]
    if request.account:
        lines.append(("account", request.account))
    if res.partition:
        lines.append(("partition", res.partition))
    lines += [("nodes", str(res.nodes)), ("ntasks-per-node", str(res.tasks_per_node)),
              ("cpus-per-task", str(res.cpus_per_task))]
    if res.mem is not None:
        lines.append(("mem", res.mem))
    lines.append(("time", res.time))
    disk = f"{profile.scratch_gres}:{res.disk_gb}" if res.disk_gb and profile.scratch_gres else None
    lines += gpu_options(profile, gpn=res.gpus_per_node, gpus_per_task=res.gpus_per_task, disk=disk)
    if request.exclusive:
        lines.append(("exclusive", ""))
    lines += [(opt, getattr(request, field)) for opt, field in JOB_OPTIONS if getattr(request, field)]
    if request.chdir:
        lines.append(("chdir", request.chdir))
    lines.append(("output", request.log or JOB_LOG))
    if request.error_log:
        lines.append(("error", request.error_log))
    lines += [(name.lstrip("-"), value) for name, value in request.sbatch_extra]
    if res.signal_seconds is not None:
        lines.append(("signal", f"B:{TIME_LIMIT_SIGNAL}@{res.signal_seconds}"))
        lines.append(("requeue", ""))
        lines.append(("open-mode", "append"))  # a requeued run must not truncate the first's log
    return tuple(lines)


def _comment_safe(text: str) -> str:
    # A newline inside an argument must not end the comment line of the header.
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _header(plan: Plan) -> list[str]:
    res, request, cluster = plan.resources, plan.settled.request, plan.settled.profile.name
    command = shlex.join(request.command) if request.command else "(library call: make_plan/render_script)"
    procs = f"{res.world_size} process{'es' if res.world_size != 1 else ''}"
    gpus = (f" x {res.gpus_per_node} GPU{'s' if res.gpus_per_node != 1 else ''}"
            if res.requests_gpus else " without GPUs")   # what the #SBATCH lines ask
    what = f"{res.nodes} node{'s' if res.nodes != 1 else ''}{gpus}, {procs}, launcher {request.launcher}"
    if plan.settled.profile.scheduler != "slurm":
        what = f"{res.world_size} CPU worker process{'es' if res.world_size != 1 else ''} on this machine"
    lines = [
        "#!/bin/bash",
        GENERATED_BY.format(version=__version__, cluster=_comment_safe(cluster))
        + (f" (partition {res.partition})" if res.partition else ""),
        f"# command: {_comment_safe(command)}",
        f"# job: {what}",
    ]
    # every value quoted for sbatch's own #SBATCH reader (checked when the request was made)
    lines += [sbatch_line(k, v) for k, v in sbatch_options(plan)]
    return lines


def _setup(plan: Plan) -> list[str]:
    out = ["", "# Strict mode. Module scripts are not written for 'nounset': -u comes after the set-up.",
           "set -eo pipefail", ""]
    setup = setup_lines(plan)
    if setup:
        out.append(f"# software set-up ({_comment_safe(plan.settled.profile.name)} profile, --module/--venv/--setup)")
        out.extend(setup)
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
    sw, cluster = plan.software, _comment_safe(plan.settled.profile.name)
    if sw.container and plan.settled.profile.scheduler == "slurm":
        runtime = sw.container.split()[0]
        out += ["# the container runtime, before anything runs in the image",
                _fail(f"command -v {q(runtime)} >/dev/null 2>&1", NO_RUNTIME.format(runtime=runtime, cluster=cluster))]
    if not sw.check_scaletrain:
        return out
    py = f"{sw.container}{sw.python}"
    out.append("# this job imports scaletrain: stop here, with the fix, if the job's Python lacks it")
    if not sw.container:
        out.append(_fail(f"command -v {sw.python} >/dev/null 2>&1", NO_PYTHON.format(py=sw.python)))
    out.append(f"{py} -c 'import scaletrain' 2>/dev/null || {{ echo "
               f"{q(MISSING.format(py=py.strip(), cluster=cluster))} >&2; exit {EXIT_ENV}; }}")
    return out


def _environment(plan: Plan) -> list[str]:
    out = ["", f"# environment: the cluster ({CLUSTER_VAR}, for scaletrain's tools in the job) "
           "and what the runtime needs from its profile"]
    out += [f"export {k}={q(v)}" for k, v in exports(plan)]
    profile = plan.settled.profile
    if profile.scheduler == "slurm":
        out += _srun_cpus(plan) + [
            "# rendezvous: the first node of the allocation, a port derived from the job id",
            "# (the same formula scaletrain.init uses, so every task agrees without talking)",
            # the suffix goes after the closing double quote: inside it, $(...) in a value would run
            'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"'
            + (q(profile.master_addr_suffix) if profile.master_addr_suffix else ""),
            "export MASTER_ADDR",
            f"export MASTER_PORT={PORT_SHELL_EXPR}",
        ]
    return out


def _srun_cpus(plan: Plan) -> list[str]:
    """The export that hands sbatch's --cpus-per-task to srun, where the planner kept it."""
    if not plan.resources.srun_cpus_export:
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
                f'else {plan.software.python} -m zipfile -e "$0" "$1"; fi')
    else:
        flag = {"tar": "", "tar.gz": "z", "tar.bz2": "j", "tar.xz": "J"}[stage.kind]
        body = f'mkdir -p "$1" && tar -x{flag}f "$0" -C "$1"'
    # The destination is computed on each node: the scratch variable is only set there.
    lines = ["", f"# stage the data to node-local scratch, once per node ({stage.kind})",
             f'export {DATA_VAR}="{dest}"']
    if plan.settled.profile.scheduler == "slurm":
        lines.append(f'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" '
                     f'--ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {q(body)} {src} "${DATA_VAR}"')
    else:
        lines.append(f'bash -c {q(body)} {src} "${DATA_VAR}"')
    lines.append(f'echo "scaletrain: data staged to ${DATA_VAR}"')
    return lines


def _folder_word(*, slurm: bool, folder: str | None = None) -> str:
    """The job's own folder as a shell word: ``folder`` (submit's run folder) or
    ``$PWD/.scaletrain/job-$SLURM_JOB_ID``, on the file system every node reads."""
    job = "$SLURM_JOB_ID" if slurm else "${SLURM_JOB_ID:-local-$$}"
    return q(folder) if folder else f'"$PWD/.scaletrain/job-{job}"'


def _job_files(files: tuple[JobFile, ...], *, slurm: bool, folder: str | None) -> list[str]:
    """The script lines that write ``files`` (each whole, then renamed) and export their paths.

    ``folder``: where they go (``submit`` gives its run folder); by default a folder of the
    job's working directory named after the job, which every node reads.
    """
    if not files:
        return []
    out = ["", "# framework configs, written by the job into a folder every node reads",
           "# (they stay there as the job's record)",
           f"export {JOB_FILES_VAR}={_folder_word(slurm=slurm, folder=folder)}",
           f'mkdir -p "${JOB_FILES_VAR}"']
    for f in files:
        path = f'"${f.var}"'
        out += [f"# {f.what}", f'export {f.var}="${JOB_FILES_VAR}/{f.name}"']
        if f.var == DEEPSPEED_CONFIG_VAR:
            out.append(f'export {LIGHTNING_DEEPSPEED_VAR}="${DEEPSPEED_CONFIG_VAR}"')
        body = f.text.rstrip("\n").split("\n")
        if f.scratch is None:
            out.append(f"cat > \"${f.var}.tmp\" <<'{HEREDOC_END}'")
            out += body
        else:
            where = "${" + f.scratch.strip("${}") + "}" if f.scratch.startswith("$") else _escape(f.scratch)
            if f.scratch.startswith("$"):
                name = f.scratch.strip("${}")
                out.append(f'[ -n "${{{name}:-}}" ] || {{ echo "scaletrain: \\${name} is not set: this job has no '
                           f'node-local disk for ZeRO\'s NVMe offload" >&2; exit 3; }}')
            # unquoted here-document: only the disk's variable expands, everything else is escaped
            out.append(f'cat > "${f.var}.tmp" <<{HEREDOC_END}')
            out += [_escape(line).replace(SCRATCH_PLACEHOLDER, where) for line in body]
        out += [HEREDOC_END, f'mv -f "${f.var}.tmp" {path}']
    return out


def _escape(line: str) -> str:
    # inside an unquoted here-document only \ $ ` are special
    return "".join("\\" + c if c in "\\$`" else c for c in line)


def _launch(plan: Plan) -> list[str]:
    out = [""]
    res, launcher = plan.resources, plan.settled.request.launcher
    slurm = plan.settled.profile.scheduler == "slurm"
    if launcher == "deepspeed" and res.nodes > 1 and slurm:
        # in the job's own folder (every node reads it), not loose in the working directory
        where = _folder_word(slurm=True, folder=plan.settled.request.files_dir)
        out += ["# DeepSpeed reads the nodes from a hostfile; each node starts its own workers (--no_ssh)",
                f'mkdir -p {where}',
                f"DS_HOSTFILE={where}/hostfile",
                f'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/$/ slots={res.gpus_per_node}/" '
                '> "$DS_HOSTFILE"',
                "export DS_HOSTFILE"]
    if not slurm:
        out.append("# launch: worker processes on this machine (gloo on the CPU)")
        out.append(launch_command(plan))
        return out
    out.append(f"# launch: {spec(launcher).comment}")
    if res.nodes > 1 and "bash -c" in launch_command(plan):
        out.append("# (values in single quotes are evaluated on each node, not here)")
    if not plan.settled.request.requeue:
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
    bound = plan.resources.max_requeues
    return [
        f"# --requeue: Slurm sends {TIME_LIMIT_SIGNAL} here {plan.resources.signal_seconds} s before the time limit, "
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
    every = plan.settled.request.sample_gpus
    if not every or plan.settled.profile.scheduler != "slurm":
        return []
    where = _folder_word(slurm=True, folder=plan.settled.request.files_dir)
    gpn = plan.resources.gpus_per_node
    gres = f" --gres=gpu:{gpn}" if gpn else ""
    return ["", f"# --sample-gpus {every}: a GPU sampler per node in the background (NVML/AMD SMI), "
                "read by 'scaletrain report'",
            f'srun --overlap --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1'
            f"{gres} {plan.software.python} -m scaletrain.observe.nodesampler {where} --interval {int(every)} &"]
