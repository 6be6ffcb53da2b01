"""Which Python environment runs scaletrain here, and whether "here" is a cluster's login node.

On a login node, ``plan`` and ``submit`` give the job the environment that runs scaletrain, as
submitit does: its venv (``sys.prefix`` differs from ``sys.base_prefix``), else its conda
environment (``$CONDA_PREFIX`` is ``sys.prefix``), else the interpreter itself
(``sys.executable``). It is found here (``found_here``) and given to a job that names none by the
plan's settle stage. Away from a cluster (a laptop) nothing is known, and the plan warns.

A login node is a machine that can submit: ``sbatch`` on PATH and a Slurm configuration it can
read (``$SLURM_CONF``, or one of the usual places, configless caches included). Every input is a
parameter, so the rule is tested without touching this machine.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Callable, Mapping

from scaletrain.plan.records import RunningEnv

# Where sbatch finds slurm.conf when $SLURM_CONF is unset (packages, source builds, configless).
SLURM_CONF_PLACES = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/usr/local/etc/slurm.conf",
                     "/run/slurm/conf/slurm.conf", "/var/spool/slurmd/conf-cache/slurm.conf")


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


def found_here(profile_python: str, *, environ: Mapping[str, str] | None = None) -> RunningEnv | None:
    """On a cluster's login node, the environment running scaletrain; None elsewhere (a laptop).

    ``environ``: the environment sbatch will run with (its ``PATH`` and ``SLURM_CONF`` decide "login
    node"). An interpreter that is the profile's ``profile_python`` on PATH (the module is loaded
    here) keeps that name, so the job runs what the set-up gives it, not a path that may exist only
    here. Whether the job takes it (it names no environment, runs in no image) the plan's settle
    stage decides (``scaletrain.plan.settle``).
    """
    env = os.environ if environ is None else environ

    def which(command: str) -> str | None:
        return shutil.which(command, path=env.get("PATH"))

    if not on_login_node(environ=env, which=which):
        return None
    found = running_environment(environ=env)
    if found.kind == "python" and same_program(profile_python, found.path, which=which):
        return RunningEnv("python", profile_python)
    return found
