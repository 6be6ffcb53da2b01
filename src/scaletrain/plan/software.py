"""The job's software: set-up lines, container prefix and exported environment, decided at plan time.

The profile gives the centre's documented set-up (``setup_lines``: modules; ``python_env_lines``:
the Python environment used when the job names none). A job overrides them:

- ``--module M`` (repeatable) replaces the profile's ``module load`` lines;
- ``--venv DIR`` / ``--conda ENV`` activate the user's environment instead of the profile's;
- ``--setup CMD`` appends shell lines, run as written (it is the user's own shell code);
- ``--env KEY=VALUE`` exports a value (quoted: it reaches the program literally).

With ``--container`` the module lines are left out (the image brings its own PyTorch) and the
profile's ``container_setup_lines`` and ``container_binds`` are used instead.
"""

from __future__ import annotations

import re
import shlex

from scaletrain.clusters.profile import ClusterProfile
from scaletrain.contract import (BACKEND_VAR, CLUSTER_VAR, DEVICE_VAR, GPU_CPU_MAP_VAR,
                                 PROCS_PER_GPU_VAR, format_gpu_cpu_map)
from scaletrain.errors import UsageError
from scaletrain.plan.request import JobRequest
from scaletrain.plan.values import check_env_name, check_text

q = shlex.quote


def setup_lines(request: JobRequest, profile: ClusterProfile) -> tuple[str, ...]:
    """The shell lines that make the job's Python (with torch) available, in order."""
    lines: list[str] = []
    if request.container:
        lines += profile.container_setup_lines
    else:
        base = list(profile.setup_lines)
        if request.launcher == "tensorflow" and profile.tensorflow_setup_lines:
            base = list(profile.tensorflow_setup_lines)   # the centre's TensorFlow, not its PyTorch
        if request.modules:
            base = [ln for ln in base if not ln.lstrip().startswith("module load")]
            base.append("module load " + " ".join(q(check_text("--module", m)) for m in request.modules))
        lines += base
        if request.venv:
            lines.append(f"source {q(check_text('--venv', request.venv).rstrip('/') + '/bin/activate')}")
        elif request.conda:
            lines += ['eval "$(conda shell.bash hook)"', f"conda activate {q(check_text('--conda', request.conda))}"]
        else:
            lines += profile.python_env_lines
    if request.procs_per_gpu > 1:
        # NVIDIA MPS lets several processes share a GPU without time slicing (Alliance PyTorch page)
        lines += ['export CUDA_MPS_PIPE_DIRECTORY="/tmp/nvidia-mps-$SLURM_JOB_ID"',
                  'export CUDA_MPS_LOG_DIRECTORY="/tmp/nvidia-log-$SLURM_JOB_ID"',
                  "nvidia-cuda-mps-control -d"]
    lines += [check_text("--setup", cmd) for cmd in request.setup]
    return tuple(lines)


def container_prefix(request: JobRequest, profile: ClusterProfile, *, scratch: str | None) -> str:
    """``apptainer exec --nv -B ... IMAGE `` (with a trailing space), or "" without a container."""
    image = request.container
    if not image:
        return ""
    wrapper = profile.container or (
        "apptainer exec --rocm" if profile.gpu_vendor == "amd" else "apptainer exec --nv")
    binds = [q(b) for b in profile.container_binds]
    if scratch:   # staged data lives under node-local scratch: the image must see it
        binds.append(f'"{scratch}"' if scratch.startswith("$") else q(scratch))
    bind = "".join(f" -B {b}" for b in binds)
    return f"{wrapper}{bind} {q(check_text('--container', image))} "


def environment(request: JobRequest, profile: ClusterProfile, *, threads: int,
                device: str) -> tuple[tuple[str, str], ...]:
    """Variables exported before launch: ours, the profile's, then the user's (--env wins)."""
    # a --profile file outside the profile folders is found by its path, a shipped one by name
    env: dict[str, str] = {CLUSTER_VAR: request.profile_file or profile.name}
    if profile.gpu_cpu_map:  # the runtime binds torchrun's workers with it (no profile read)
        env[GPU_CPU_MAP_VAR] = format_gpu_cpu_map(profile.gpu_cpu_map)
    if device == "cpu":
        env[DEVICE_VAR] = "cpu"
        if request.launcher == "accelerate":
            # 'accelerate launch --cpu' starts ONE process per machine unless given an MPI
            # hostfile; '--multi_gpu' with this variable starts them all, on the CPU, as MULTI_CPU
            env["ACCELERATE_USE_CPU"] = "true"
    env["OMP_NUM_THREADS"] = str(threads)
    if request.procs_per_gpu > 1:   # the runtime's contract: rank r uses GPU r // K, gloo (NCCL refuses)
        env[PROCS_PER_GPU_VAR] = str(request.procs_per_gpu)
        env[BACKEND_VAR] = "gloo"
    env.update(sorted(profile.env.items()))
    for key, value in request.env:
        env[check_env_name(key)] = check_text(f"--env {key}", value)
    return tuple(env.items())


def program_words(request: JobRequest) -> str:
    """The script and its arguments as shell words: quoted, or with ``$NAME`` left to expand.

    ``--expand-args`` is the explicit way to pass ``$SLURM_JOB_ID`` or ``$LOCAL_SCRATCH``
    through to the program: only ``$NAME``/``${NAME}`` expand, when the job runs, in the batch
    shell before srun starts the tasks (inside double quotes: no word splitting or globbing);
    backquotes, ``$(...)`` and every other character stay literal. Per-task values
    (``$SLURM_PROCID``...) would be the batch shell's, not each task's: they are refused.
    """
    words = [check_text("the training script", request.script)]
    words += [check_text(f"program argument {i + 1}", a) for i, a in enumerate(request.script_args)]
    if not request.expand_args:
        return " ".join(q(w) for w in words)
    return " ".join(_expanding(w) for w in words)


# Set by srun for each task: in the batch shell they are unset or the batch task's own.
PER_TASK_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "RANK", "LOCAL_RANK")


def _expanding(word: str) -> str:
    out, pos = [], 0
    for m in re.finditer(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)", word):
        if m.group().strip("${}") in PER_TASK_VARS:
            raise UsageError(f"--expand-args: {m.group()} would expand in the batch shell, not in each task",
                             "read it inside the program (os.environ), or use scaletrain.init()")
        out.append(_dq_literal(word[pos:m.start()]))
        out.append(m.group())
        pos = m.end()
    out.append(_dq_literal(word[pos:]))
    return '"' + "".join(out) + '"'


def _dq_literal(text: str) -> str:
    # inside double quotes only \ $ ` " are special (history expansion is off in scripts)
    return "".join("\\" + c if c in '\\$`"' else c for c in text)
