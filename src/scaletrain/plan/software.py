"""The job's software: set-up lines, container prefix and exported environment, decided at plan time.

The profile gives the centre's documented set-up (``setup_lines``: modules; ``python_env_lines``:
the Python environment used when the job names none). A job overrides them:

- ``--module M`` (repeatable) replaces the profile's ``module load`` lines;
- ``--venv DIR`` / ``--conda ENV`` activate the user's environment instead of the profile's;
- ``--setup CMD`` appends shell lines, run as written (it is the user's own shell code);
- ``--env KEY=VALUE`` exports a value (quoted: it reaches the program literally).

With ``--container`` the module lines are left out (the image brings its own PyTorch) and the
profile's ``container_setup_lines`` and ``container_binds`` are used instead. A profile whose
software is a container (``software = "container"``, LUMI's AI Factory images) runs every job in
its ``default_image`` with its ``container`` wrapper (``singularity exec``) unless the job names
another image, or asks for the centre's modules with ``--module``. A ``--venv`` made inside the
image (``scaletrain env create``) goes first on the container's PATH.
"""

from __future__ import annotations

import re
import shlex

from scaletrain.clusters.model import JOB_PACKAGES
from scaletrain.clusters.profile import ClusterProfile
from scaletrain.contract.environ import (BACKEND_VAR, CLUSTER_VAR, DEVICE_VAR, GPU_CPU_MAP_VAR, PROCS_PER_GPU_VAR,
                                         format_gpu_cpu_map)
from scaletrain.errors import UsageError
from scaletrain.plan.request import JobRequest

q = shlex.quote


def image(request: JobRequest, profile: ClusterProfile) -> str | None:
    """The image the program runs in: ``--container``, else the profile's default one, or None.

    ``--module`` on a container profile asks for the centre's modules instead (CSC's PyTorch
    module on LUMI, on request only).
    """
    if request.container:
        return request.container
    if request.launcher == "tensorflow" and profile.tensorflow_setup_lines:
        return None   # the centre's TensorFlow module (CSC's on LUMI), not the PyTorch image
    if profile.software == "container" and profile.default_image and not request.modules:
        return profile.default_image
    return None


def runtime(profile: ClusterProfile) -> str:
    """The container wrapper command: the profile's (``singularity exec``), else apptainer's."""
    return profile.container or ("apptainer exec --rocm" if profile.gpu_vendor == "amd" else "apptainer exec --nv")


def setup_lines(request: JobRequest, profile: ClusterProfile) -> tuple[str, ...]:
    """The shell lines that make the job's Python (with torch) available, in order."""
    lines: list[str] = []
    if image(request, profile):
        lines += profile.container_setup_lines
        if request.venv:   # a venv made in the image: its bin first on the container's PATH
            bin_dir = q(request.venv.rstrip("/") + "/bin")
            lines += [f"export SINGULARITYENV_PREPEND_PATH={bin_dir}",
                      f"export APPTAINERENV_PREPEND_PATH={bin_dir}"]
    else:
        base = list(profile.setup_lines)
        if request.launcher == "tensorflow" and profile.tensorflow_setup_lines:
            base = list(profile.tensorflow_setup_lines)   # the centre's TensorFlow, not its PyTorch
        if request.modules:
            base = [ln for ln in base if not ln.lstrip().startswith("module load")]
            base.append("module load " + " ".join(q(m) for m in request.modules))
        lines += base
        if request.venv:
            lines.append(f"source {q(request.venv.rstrip('/') + '/bin/activate')}")
        elif request.conda:
            lines += ['eval "$(conda shell.bash hook)"', f"conda activate {q(request.conda)}"]
        else:
            wheels = job_wheels(request, profile)
            lines += [ln.replace(JOB_PACKAGES, wheels) for ln in profile.python_env_lines]
    if request.procs_per_gpu > 1:
        # NVIDIA MPS lets several processes share a GPU without time slicing (Alliance PyTorch page)
        lines += ['export CUDA_MPS_PIPE_DIRECTORY="/tmp/nvidia-mps-$SLURM_JOB_ID"',
                  'export CUDA_MPS_LOG_DIRECTORY="/tmp/nvidia-log-$SLURM_JOB_ID"',
                  "nvidia-cuda-mps-control -d"]
    lines += request.setup
    return tuple(lines)


def container_prefix(request: JobRequest, profile: ClusterProfile, *, scratch: str | None) -> str:
    """``apptainer exec --nv -B ... IMAGE `` (with a trailing space), or "" without a container."""
    img = image(request, profile)
    if not img:
        return ""
    wrapper = runtime(profile)
    binds = [q(b) for b in profile.container_binds]
    if scratch:   # staged data lives under node-local scratch: the image must see it
        binds.append(f'"{scratch}"' if scratch.startswith("$") else q(scratch))
    bind = "".join(f" -B {b}" for b in binds)
    return f"{wrapper}{bind} {q(img)} "


def job_wheels(request: JobRequest, profile: ClusterProfile) -> str:
    """What the job's own venv installs from the centre's wheelhouse: torch, or the launcher's
    framework where the wheelhouse has it (the Alliance's tensorflow), and the request's ``wheels``."""
    base = profile.wheels.get(request.launcher, "torch")
    return " ".join(dict.fromkeys([*base.split(), *request.wheels]))


# What each launcher needs in the job's Python besides torch (the Alliance's job venv has only torch,
# or the framework its wheelhouse has for the launcher: tensorflow).
LAUNCHER_PACKAGES = {"accelerate": "accelerate", "deepspeed": "deepspeed", "lightning": "lightning",
                     "tensorflow": "tensorflow"}


def python_of(request: JobRequest, profile: ClusterProfile) -> str:
    """The interpreter the job runs: the one that runs scaletrain on the login node, else the profile's."""
    if request.python and not image(request, profile):
        return q(request.python)
    return profile.python


def describe(request: JobRequest, profile: ClusterProfile) -> str:
    """Which Python environment the job uses, in a few words (the summary's ``software:`` line)."""
    origin = f" ({request.env_origin})" if request.env_origin else ""
    img = image(request, profile)
    if img:
        where = "--container" if request.container else f"the {profile.name} profile's default image"
        inside = f", venv {request.venv} inside it{origin}" if request.venv else ""
        return f"container {img} ({where}){inside}"
    if request.venv:
        return f"venv {request.venv}{origin or ' (--venv)'}"
    if request.conda:
        return f"conda environment {request.conda}{origin or ' (--conda)'}"
    if request.python:
        return f"{request.python}{origin}"
    if profile.python_env_lines:
        return f"a venv the job builds from the centre's wheels ({job_wheels(request, profile)} only)"
    modules = [ln for ln in setup_lines(request, profile) if ln.lstrip().startswith("module load")]
    return "the centre's modules (" + "; ".join(modules) + ")" if modules else f"{profile.python} on the nodes"


def known(request: JobRequest) -> bool:
    """True when the job names its Python environment (flags, or the one running scaletrain)."""
    return bool(request.venv or request.conda or request.python)


def warnings(request: JobRequest, profile: ClusterProfile, *, needs_scaletrain: bool) -> list[str]:
    """What the job's software will lack, said at plan time (not after the wait in the queue)."""
    if profile.scheduler != "slurm" or known(request) or request.container:
        return []   # --container: the user's own image may well hold scaletrain (the job checks)
    fix = (f"on a {profile.name} login node run 'scaletrain env create --cluster {profile.name} "
           "{extra}DIR' and pass --venv DIR (or plan there, from that environment)")
    if needs_scaletrain:
        # the framework comes from the wheelhouse into the same venv (the Alliance's tensorflow)
        wheel = profile.wheels.get(request.launcher) if profile.python_env_lines else None
        return [f"the job will not find scaletrain: {describe(request, profile)} has none, and no environment "
                "of yours is known here (the job would stop at its import check, after its wait in the "
                "queue); fix: " + fix.format(extra=f"--with {wheel} " if wheel else "")]
    pkg = LAUNCHER_PACKAGES.get(request.launcher)
    if pkg and profile.python_env_lines and pkg not in job_wheels(request, profile).split():
        return [f"--launcher {request.launcher}: the job's venv gets only torch from the centre's wheels, "
                f"not {pkg}; fix: " + fix.format(extra=f"--with {pkg} ")]
    return []


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
    env.update(request.env)
    return tuple(env.items())


def program_words(request: JobRequest) -> str:
    """The script and its arguments as shell words: quoted, or with ``$NAME`` left to expand.

    ``--expand-args`` is the explicit way to pass ``$SLURM_JOB_ID`` or ``$LOCAL_SCRATCH``
    through to the program: only ``$NAME``/``${NAME}`` and arithmetic on names and numbers
    (``$((SLURM_NNODES * 4))``) expand, when the job runs, in the batch
    shell before srun starts the tasks (inside double quotes: no word splitting or globbing);
    backquotes, ``$(...)`` and every other character stay literal. Per-task values
    (``$SLURM_PROCID``...) would be the batch shell's, not each task's: they are refused.
    """
    words = [request.script, *request.script_args]
    if not request.expand_args:
        return " ".join(q(w) for w in words)
    return " ".join(_expanding(w) for w in words)


# Set by srun for each task: in the batch shell they are unset or the batch task's own.
PER_TASK_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "RANK", "LOCAL_RANK")


# $NAME, ${NAME}, or arithmetic on names and numbers only ($((SLURM_NNODES * 4))): nothing in
# it can run a command ($(...), backquotes and array subscripts are not among its characters)
_EXPANSION = re.compile(r"\$\(\(([A-Za-z0-9_ +*/%()-]*)\)\)|\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def _expanding(word: str) -> str:
    out, pos = [], 0
    for m in _EXPANSION.finditer(word):
        names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(1)) if m.group(1) is not None else \
            [m.group().strip("${}")]
        task = next((n for n in names if n in PER_TASK_VARS), None)
        if task:
            raise UsageError(f"--expand-args: {m.group()} would expand in the batch shell, not in each task "
                             f"(${task})", "read it inside the program (os.environ), or use scaletrain.init()")
        out.append(_dq_literal(word[pos:m.start()]))
        out.append(m.group())
        pos = m.end()
    out.append(_dq_literal(word[pos:]))
    return '"' + "".join(out) + '"'


def _dq_literal(text: str) -> str:
    # inside double quotes only \ $ ` " are special (history expansion is off in scripts)
    return "".join("\\" + c if c in '\\$`"' else c for c in text)
