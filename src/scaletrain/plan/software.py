"""Stage 3, software: the job's Python and how the script gives it to the job, computed once into
a ``Software`` record (set-up lines, interpreter, container prefix, exported environment).

The profile gives the centre's documented set-up (``setup_lines``: modules; ``python_env_lines``:
the Python environment used when the job names none). A job overrides them:

- ``--module M`` (repeatable) replaces the profile's ``module load`` lines;
- ``--venv DIR`` / ``--conda ENV`` activate the user's environment instead of the profile's;
- ``--setup CMD`` appends shell lines, run as written (it is the user's own shell code);
- ``--env KEY=VALUE`` exports a value (quoted: it reaches the program literally).

With an image (``Settled.image``: ``--container``, or the default image of a profile whose
software is a container, LUMI's AI Factory images) the module lines are left out (the image
brings its own PyTorch) and the profile's ``container_setup_lines`` and ``container_binds`` are
used instead, with its ``container`` wrapper (``singularity exec``). A ``--venv`` made inside the
image (``scaletrain env create``) goes first on the container's PATH.
"""

from __future__ import annotations

import shlex

from scaletrain.clusters.model import JOB_PACKAGES, ClusterProfile
from scaletrain.contract.environ import (BACKEND_VAR, CLUSTER_VAR, DEVICE_VAR, GPU_CPU_MAP_VAR, PROCS_PER_GPU_VAR,
                                         format_gpu_cpu_map)
from scaletrain.plan.launchers import SPECS
from scaletrain.plan.records import Allocation, Settled, Software
from scaletrain.plan.request import JobRequest
from scaletrain.plan.settle import names_environment

q = shlex.quote

# What each launcher needs in the job's Python besides torch (the Alliance's job venv has only torch,
# or the framework its wheelhouse has for the launcher: tensorflow).
LAUNCHER_PACKAGES = {"accelerate": "accelerate", "deepspeed": "deepspeed", "lightning": "lightning",
                     "tensorflow": "tensorflow"}
# NVIDIA MPS lets several processes share a GPU without time slicing (Alliance PyTorch page)
_MPS = ('export CUDA_MPS_PIPE_DIRECTORY="/tmp/nvidia-mps-$SLURM_JOB_ID"',
        'export CUDA_MPS_LOG_DIRECTORY="/tmp/nvidia-log-$SLURM_JOB_ID"',
        "nvidia-cuda-mps-control -d")


def plan_software(settled: Settled, resources: Allocation) -> Software:
    """The job's software on ``settled.profile``, for the processes ``resources`` laid out."""
    request, profile, img = settled.request, settled.profile, settled.image
    wheels = " ".join(dict.fromkeys([*profile.wheels.get(request.launcher, "torch").split(), *request.wheels]))
    builds_venv = not img and not names_environment(request) and bool(profile.python_env_lines)
    needs_scaletrain = SPECS[request.launcher].needs_scaletrain
    setup = _setup_lines(request, profile, img, wheels=wheels)
    description = _describe(request, profile, img, setup, wheels=wheels, builds_venv=builds_venv)
    scratch = resources.stage.scratch_var if resources.stage else None
    return Software(
        setup=setup, mps=_MPS if request.procs_per_gpu > 1 else (),
        python=q(request.python) if request.python and not img else profile.python,
        container=_container_prefix(img, profile, scratch=scratch),
        container_here=_container_prefix(img, profile, scratch=None), exec_wrapper=profile.exec_wrapper,
        builds_venv=builds_venv, wheels=wheels,
        env=_environment(request, profile, threads=resources.threads_per_proc, device=resources.device),
        check_scaletrain=needs_scaletrain or profile.scheduler == "none", description=description,
        warnings=_warnings(request, profile, description, wheels=wheels, needs_scaletrain=needs_scaletrain),
        notes=_notes(request, profile, img, resources))


def runtime(profile: ClusterProfile) -> str:
    """The container wrapper command: the profile's (``singularity exec``), else apptainer's."""
    return profile.container or ("apptainer exec --rocm" if profile.gpu_vendor == "amd" else "apptainer exec --nv")


def _setup_lines(request: JobRequest, profile: ClusterProfile, img: str | None, *, wheels: str) -> tuple[str, ...]:
    """The shell lines that make the job's Python (with torch) available, in order."""
    lines: list[str] = []
    if img:
        lines += profile.container_setup_lines
        if request.venv:   # a venv made in the image: its bin first on the container's PATH
            bin_dir = q(request.venv.rstrip("/") + "/bin")
            lines += [f"export SINGULARITYENV_PREPEND_PATH={bin_dir}",
                      f"export APPTAINERENV_PREPEND_PATH={bin_dir}"]
        return tuple(lines)
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
        lines += [ln.replace(JOB_PACKAGES, wheels) for ln in profile.python_env_lines]
    return tuple(lines)


def _container_prefix(img: str | None, profile: ClusterProfile, *, scratch: str | None) -> str:
    """``apptainer exec --nv -B ... IMAGE `` (with a trailing space), or "" without an image."""
    if not img:
        return ""
    binds = [q(b) for b in profile.container_binds]
    if scratch:   # staged data lives under node-local scratch: the image must see it
        binds.append(f'"{scratch}"' if scratch.startswith("$") else q(scratch))
    bind = "".join(f" -B {b}" for b in binds)
    return f"{runtime(profile)}{bind} {q(img)} "


def _describe(request: JobRequest, profile: ClusterProfile, img: str | None, setup: tuple[str, ...], *,
              wheels: str, builds_venv: bool) -> str:
    """Which Python environment the job uses, in a few words (the summary's ``software:`` line)."""
    origin = f" ({request.env_origin})" if request.env_origin else ""
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
    if builds_venv:
        return f"a venv the job builds from the centre's wheels ({wheels} only)"
    # a --setup line may load one too
    modules = [ln for ln in (*setup, *request.setup) if ln.lstrip().startswith("module load")]
    return "the centre's modules (" + "; ".join(modules) + ")" if modules else f"{profile.python} on the nodes"


def _warnings(request: JobRequest, profile: ClusterProfile, description: str, *, wheels: str,
              needs_scaletrain: bool) -> tuple[str, ...]:
    """What the job's software will lack, said at plan time (not after the wait in the queue)."""
    if profile.scheduler != "slurm" or names_environment(request) or request.container:
        return ()   # --container: the user's own image may well hold scaletrain (the job checks)
    fix = (f"on a {profile.name} login node run 'scaletrain env create --cluster {profile.name} "
           "{extra}DIR' and pass --venv DIR (or plan there, from that environment)")
    if needs_scaletrain:
        # the framework comes from the wheelhouse into the same venv (the Alliance's tensorflow)
        wheel = profile.wheels.get(request.launcher) if profile.python_env_lines else None
        return (f"the job will not find scaletrain: {description} has none, and no environment "
                "of yours is known here (the job would stop at its import check, after its wait in the "
                "queue); fix: " + fix.format(extra=f"--with {wheel} " if wheel else ""),)
    pkg = LAUNCHER_PACKAGES.get(request.launcher)
    if pkg and profile.python_env_lines and pkg not in wheels.split():
        return (f"--launcher {request.launcher}: the job's venv gets only torch from the centre's wheels, "
                f"not {pkg}; fix: " + fix.format(extra=f"--with {pkg} "),)
    return ()


def _environment(request: JobRequest, profile: ClusterProfile, *, threads: int,
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


def _notes(request: JobRequest, profile: ClusterProfile, img: str | None, resources: Allocation) -> tuple[str, ...]:
    """What the plan's summary says of the job's software."""
    notes = []
    if img and profile.container is None:
        notes.append("the program runs inside the container given by --container (apptainer exec)")
    horovod = profile.missing_launchers.get("horovod")
    own_env = request.venv or request.conda or request.container
    if horovod and request.launcher == "mpi" and request.program_imports is None:
        notes.append(f"if the program uses Horovod: {horovod}; bring it with --venv or --container")
    elif horovod and "horovod" in (request.program_imports or ()):
        notes.append("Horovod from your own environment: its last release (0.28.1) builds against torch >= 2.1 "
                     "only with its PyTorch extension raised to C++17 (docs/bring-your-script.md, 'Building Horovod')")
    elif "horovod" in profile.wheels and request.launcher == "mpi" and not own_env and \
            "horovod" in (request.program_imports or ("horovod",)):
        notes.append(f"if the program uses Horovod: the job's venv gets only torch; make one with the centre's "
                     f"Horovod wheel ('scaletrain env create --cluster {profile.name} --with horovod DIR') and "
                     "pass --venv DIR")
    if resources.venv_in_scratch:
        notes.append(f"the job builds its venv in {profile.scratch_var}, which is memory on {profile.name} "
                     "(no local disk): it takes a few GB of the job's memory; a venv on $SCRATCH (--venv) does not")
    if resources.nodes > 1 and profile.module_multinode_warning and not request.container and (
            profile.software == "module" or request.modules):
        notes.append(profile.module_multinode_warning)
    return tuple(notes)


__all__ = ["LAUNCHER_PACKAGES", "plan_software", "runtime"]
