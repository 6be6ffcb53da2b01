"""Stage 1, settle: a request and a cluster profile become a ``Settled`` record. Pure.

What only the submitting machine can tell (the staged data's size, the program's imports, the
account default, the environment running scaletrain on a login node) is read before this stage,
by :func:`scaletrain.jobs.submit.plan_job`, and handed in: the measurements as the request's
fields, the running environment as ``running``. ``port`` hands in its own request and the target
cluster, and no running environment (the job is planned for another cluster, not here).

Decided here, once: the image the program runs in (a job in an image keeps the image's Python,
so it is decided before the running environment is given to the job) and the environment found
on a login node for a job that names none; then what the request asks of this cluster and how
its flags combine is checked (each value was checked when the request was made).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scaletrain.clusters.model import ClusterProfile
from scaletrain.contract.environ import EXIT_STOPPED, TIME_LIMIT_SIGNAL
from scaletrain.errors import PlanError, UsageError
from scaletrain.plan.launchers import SPECS
from scaletrain.plan.records import RunningEnv, Settled
from scaletrain.plan.request import JobRequest


def settle(request: JobRequest, profile: ClusterProfile, *, running: RunningEnv | None = None) -> Settled:
    """The request settled on ``profile``: its image and its environment; checked.

    ``running``: the environment running scaletrain, where this machine is the cluster's login node
    (None elsewhere); a Slurm job that names no environment and runs in no image gets it, as
    submitit does. Raises UsageError for flags that do not combine and PlanError (exit 2, with a
    hint) for what this cluster does not take.
    """
    img = image(request, profile)
    if running is not None and profile.scheduler == "slurm" and not names_environment(request) and not img:
        found: dict[str, Any] = {running.kind: running.path, "env_origin": running.origin}   # venv, conda or python
        request = dataclasses.replace(request, **found)
    _check_request(request, profile)
    return Settled(request=request, profile=profile, image=img)


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


def names_environment(request: JobRequest) -> bool:
    """True when the job names its Python environment (flags, or the one running scaletrain)."""
    return bool(request.venv or request.conda or request.python)


def check_live(profile: ClusterProfile) -> None:
    """PlanError (exit 2) naming the successor when the profile's system no longer runs jobs."""
    if profile.retired:
        succ = profile.successor or "a live system"
        raise PlanError(f"{profile.name} was retired on {profile.retired} and runs no jobs; its successor is {succ}",
                        f"plan with --cluster {succ}; carry an old script over with "
                        f"'scaletrain port OLD.sh --cluster {succ}'")


def _check_request(req: JobRequest, profile: ClusterProfile) -> None:
    """What the request asks of this cluster, and how its flags combine."""
    check_live(profile)
    if req.cpus is not None and profile.cpu_jobs:
        raise PlanError(f"the {profile.name} profile's nodes take no CPU-only jobs (--cpus)", profile.cpu_jobs)
    if req.cpus is not None:
        if req.gpus is not None or req.gpus_per_node is not None:
            raise UsageError("--cpus is for a CPU-only job: leave out --gpus/--gpus-per-node",
                             "a GPU job gets its CPUs from --cpus-per-gpu")
    elif (req.gpus is None) == (req.nodes is None):
        raise UsageError("give --gpus N or --nodes M, not both" if req.gpus is not None else
                         "say how many GPUs: --gpus N or --nodes M (or --cpus N for a CPU-only job)",
                         "e.g. --gpus 8, or --nodes 2 --gpus-per-node 4")
    if req.gpus_per_node is not None and req.nodes is None:
        raise UsageError("--gpus-per-node goes with --nodes", "use --nodes M --gpus-per-node G, or --gpus N")
    if profile.account_required and not req.account:
        raise PlanError(f"cluster {profile.name!r} requires --account (the project billed for the job)",
                        "add --account <project>, or export SBATCH_ACCOUNT=<project>")
    if req.procs_per_gpu > 1 and (profile.gpu_vendor != "nvidia" or (req.nodes or 1) > 1
                                  or (req.gpus or 0) > profile.gpus_per_node):
        raise UsageError("--procs-per-gpu needs NVIDIA MPS on one node (the batch script starts its daemon)",
                         "use one node of an NVIDIA cluster, or one process per GPU")
    if req.launcher == "tensorflow" and profile.scheduler != "slurm":
        raise UsageError(f"--launcher tensorflow builds TF_CONFIG from a Slurm allocation; the {profile.name} "
                         "profile has none",
                         "plan for a cluster, or try the program here with 'scaletrain run --emulate slurm' "
                         "and TF_CONFIG from 'python -m scaletrain.frameworks.tensorflow'")
    if req.requeue and req.launcher in SPECS and not SPECS[req.launcher].requeue_ok:
        raise UsageError(f"--requeue cannot work with --launcher {req.launcher}: its per-node agent dies of the "
                         f"{TIME_LIMIT_SIGNAL} that asks the workers to save, and exits 1 (not {EXIT_STOPPED}) "
                         "when they stop",
                         "use --launcher scaletrain-run (torchrun-style scripts run unchanged and the signal "
                         "reaches them), or a launcher with one task per GPU (scaletrain, srun)")
    _check_horovod(req, profile)
    missing = profile.missing_launchers.get(req.launcher)
    if missing and not (req.container or req.venv or req.conda or req.modules):
        raise PlanError(f"--launcher {req.launcher} on {profile.name}: {missing}",
                        "bring an environment that has it (--container IMAGE, --venv DIR or --module NAME), "
                        "or use a PyTorch launcher")


def _check_horovod(req: JobRequest, profile: ClusterProfile) -> None:
    """A program that imports horovod: one task per GPU, and an environment that has Horovod."""
    if "horovod" not in (req.program_imports or ()):
        return
    if SPECS[req.launcher].per_node:
        raise UsageError(f"{req.script} imports horovod, which takes its ranks from MPI (one task per GPU); "
                         f"--launcher {req.launcher} starts one task per node",
                         "use --launcher mpi (srun starts one task per GPU, as the Alliance's Horovod job does)")
    missing = profile.missing_launchers.get("horovod")
    if missing and not (req.container or req.venv or req.conda):
        raise PlanError(f"{req.script} imports horovod, and {profile.name}'s software has none: {missing}",
                        "bring an environment with Horovod built against the cluster's PyTorch (--venv DIR "
                        "or --container IMAGE), or train with PyTorch DDP (no horovod import)")


__all__ = ["check_live", "image", "names_environment", "settle"]
