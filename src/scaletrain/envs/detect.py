"""Which Python environment runs scaletrain here, and whether "here" is a cluster's login node.

On a login node, ``plan`` and ``submit`` give the job the environment that runs scaletrain, as
submitit does: its venv (``sys.prefix`` differs from ``sys.base_prefix``), else its conda
environment (``$CONDA_PREFIX`` is ``sys.prefix``), else the interpreter itself
(``sys.executable``). Away from a cluster (a laptop) nothing is known, and the plan warns.

A login node is a machine that can submit: ``sbatch`` on PATH and a Slurm configuration it can
read (``$SLURM_CONF``, or one of the usual places, configless caches included). Every input is a
parameter, so the rule is tested without touching this machine.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:
    from scaletrain.clusters.profile import ClusterProfile
    from scaletrain.plan.request import JobRequest

# Where sbatch finds slurm.conf when $SLURM_CONF is unset (packages, source builds, configless).
SLURM_CONF_PLACES = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/usr/local/etc/slurm.conf",
                     "/run/slurm/conf/slurm.conf", "/var/spool/slurmd/conf-cache/slurm.conf")


@dataclass(frozen=True)
class RunningEnv:
    """The environment running scaletrain: ``kind`` is "venv", "conda" or "python"."""

    kind: str
    path: str

    @property
    def origin(self) -> str:
        """How it was found, for the plan's summary."""
        what = {"venv": "the venv", "conda": "the conda environment", "python": "the Python"}[self.kind]
        return f"{what} running scaletrain on this login node"


def on_login_node(*, environ: Mapping[str, str] | None = None,
                  which: Callable[[str], str | None] = shutil.which,
                  exists: Callable[[str], bool] = os.path.isfile) -> bool:
    """True when this machine can submit jobs: sbatch on PATH and a Slurm configuration."""
    env = os.environ if environ is None else environ
    if not which("sbatch"):
        return False
    conf = env.get("SLURM_CONF")
    return bool(conf and exists(conf)) or any(exists(p) for p in SLURM_CONF_PLACES)


def running_environment(*, environ: Mapping[str, str] | None = None, prefix: str | None = None,
                        base_prefix: str | None = None, executable: str | None = None) -> RunningEnv:
    """The venv, conda environment or interpreter this process runs in."""
    env = os.environ if environ is None else environ
    prefix = sys.prefix if prefix is None else prefix
    base = sys.base_prefix if base_prefix is None else base_prefix
    exe = sys.executable if executable is None else executable
    if os.path.realpath(prefix) != os.path.realpath(base):
        return RunningEnv("venv", prefix)
    conda = env.get("CONDA_PREFIX")
    if conda and os.path.realpath(conda) == os.path.realpath(prefix):
        return RunningEnv("conda", conda)
    return RunningEnv("python", exe or "python3")


def same_program(name: str, path: str, *, which: Callable[[str], str | None] = shutil.which) -> bool:
    """True when ``name`` on PATH is the file ``path`` (``python3`` here is this interpreter)."""
    found = which(name)
    return found is not None and os.path.realpath(found) == os.path.realpath(path)


def with_running_environment(request: JobRequest, profile: ClusterProfile, *,
                             environ: Mapping[str, str] | None = None) -> JobRequest:
    """On a login node, a job that names no environment gets the one running scaletrain.

    As submitit does: its venv, conda environment or interpreter. Not for a container job (that
    Python is the image's) nor away from a cluster (the plan warns). ``environ``: the
    environment sbatch will run with (its ``PATH`` and ``SLURM_CONF`` decide "login node").
    """
    import dataclasses

    from scaletrain.plan import software

    env = os.environ if environ is None else environ
    if (profile.scheduler != "slurm" or software.known(request) or software.image(request, profile)
            or not on_login_node(environ=env, which=lambda c: shutil.which(c, path=env.get("PATH")))):
        return request
    found = running_environment(environ=env)
    path = found.path
    if found.kind == "python" and same_program(profile.python, path,
                                               which=lambda c: shutil.which(c, path=env.get("PATH"))):
        # the profile's python3 is this interpreter (the module is loaded here): keep its name,
        # so the job runs what the set-up gives it, not a path that may exist only here
        path = profile.python
    if found.kind == "venv":
        return dataclasses.replace(request, venv=path, env_origin=found.origin)
    if found.kind == "conda":
        return dataclasses.replace(request, conda=path, env_origin=found.origin)
    return dataclasses.replace(request, python=path, env_origin=found.origin)
