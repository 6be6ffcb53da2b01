"""The ``#SBATCH`` options of a plan, in order (the request's values were checked when it was made).

The layout options come from the plan's arithmetic; the job options (mail, array, constraint,
dependency, reservation, QOS, log names, working directory) from their own flags; anything else
from ``--sbatch OPTION[=VALUE]``, refused when it would contradict what the plan computed.
"""

from __future__ import annotations

import re

from scaletrain.clusters.profile import ClusterProfile, format_time
from scaletrain.contract.environ import TIME_LIMIT_SIGNAL
from scaletrain.contract.files import JOB_LOG
from scaletrain.errors import UsageError
from scaletrain.plan.request import JOB_OPTIONS, JobRequest

# Options the plan computes, and the flag that sets each (None: the plan decides it alone).
COMPUTED: dict[str, str | None] = {
    "job-name": "--job-name", "account": "--account", "partition": "--partition", "time": "--time",
    "nodes": "--nodes", "ntasks": None, "ntasks-per-node": "--launcher", "tasks-per-node": "--launcher",
    "cpus-per-task": "--cpus-per-gpu", "cpus-per-gpu": "--cpus-per-gpu", "mem": "--mem-per-gpu",
    "mem-per-gpu": "--mem-per-gpu", "mem-per-cpu": "--mem-per-gpu", "gres": "--gpus", "gpus": "--gpus",
    "gpus-per-node": "--gpus", "gpus-per-task": "--gpus", "output": "--log", "error": "--error",
    "chdir": "--chdir", "signal": "--requeue", "requeue": "--requeue", "no-requeue": "--requeue",
    "open-mode": "--requeue",
    "mail-type": "--mail-type", "mail-user": "--mail-user", "array": "--array",
    "constraint": "--constraint", "exclusive": "--exclusive", "dependency": "--dependency",
    "reservation": "--reservation", "qos": "--qos", "wrap": None, "export": "--env",
}

# An option name as an #SBATCH line writes it (after the --).
_OPTION_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


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


def _extra(request: JobRequest) -> list[tuple[str, str]]:
    out = []
    for name, value in request.sbatch_extra:
        name = name.lstrip("-")
        if name in COMPUTED:
            flag = COMPUTED[name]
            raise UsageError(f"--sbatch {name} contradicts what the plan computes",
                             f"use {flag} instead" if flag else "leave it out: the plan sets it")
        if len(name) < 2:
            raise UsageError(f"--sbatch {name}: give the long option name", "e.g. --sbatch begin=now+1hour")
        if not _OPTION_NAME.match(name):
            raise UsageError(f"#SBATCH option {name!r} is not an option name", "e.g. mail-type")
        out.append((name, value))
    return out


def sbatch_options(request: JobRequest, profile: ClusterProfile, *, job_name: str, partition: str | None,
                   nodes: int, tasks_per_node: int, cpus_per_task: int, mem: str | None, seconds: int,
                   gpn: int, gpus_per_task: int, disk_gb: int | None,
                   signal_s: int | None) -> tuple[tuple[str, str], ...]:
    """Ordered (option, value) pairs; value "" is a bare flag.

    ``disk_gb``: node-local disk to request where the cluster sells it as a GRES (staged data,
    DeepSpeed's NVMe offload).
    """
    if profile.scheduler != "slurm":
        return ()
    lines: list[tuple[str, str]] = [("job-name", job_name)]
    if request.account:
        lines.append(("account", request.account))
    if partition:
        lines.append(("partition", partition))
    lines += [("nodes", str(nodes)), ("ntasks-per-node", str(tasks_per_node)),
              ("cpus-per-task", str(cpus_per_task))]
    if mem is not None:
        lines.append(("mem", mem))
    lines.append(("time", format_time(seconds)))
    disk = f"{profile.scratch_gres}:{disk_gb}" if disk_gb and profile.scratch_gres else None
    lines += gpu_options(profile, gpn=gpn, gpus_per_task=gpus_per_task, disk=disk)
    if request.exclusive:
        lines.append(("exclusive", ""))
    lines += [(opt, getattr(request, field)) for opt, field in JOB_OPTIONS if getattr(request, field)]
    if request.chdir:
        lines.append(("chdir", request.chdir))
    lines.append(("output", request.log or JOB_LOG))
    if request.error_log:
        lines.append(("error", request.error_log))
    lines += _extra(request)
    if signal_s is not None:
        lines.append(("signal", f"B:{TIME_LIMIT_SIGNAL}@{signal_s}"))
        lines.append(("requeue", ""))
        lines.append(("open-mode", "append"))  # a requeued run must not truncate the first's log
    return tuple(lines)
