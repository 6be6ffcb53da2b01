"""The ``#SBATCH`` options of a plan, in order: text from the records, no rule of its own.

The layout options come from the resources stage's ``Allocation``, written in the cluster's GPU
syntax; the job options (mail, array, constraint, dependency, reservation, QOS, log names,
working directory) from their own flags; anything else from ``--sbatch OPTION[=VALUE]`` (whose
names were checked when the request was made, ``scaletrain.plan.values.COMPUTED``).
"""

from __future__ import annotations

from scaletrain.clusters.model import ClusterProfile
from scaletrain.contract.environ import TIME_LIMIT_SIGNAL
from scaletrain.contract.files import JOB_LOG
from scaletrain.plan.records import Plan
from scaletrain.plan.request import JOB_OPTIONS


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
    """Ordered (option, value) pairs; value "" is a bare flag. Node-local disk (staged data,
    DeepSpeed's NVMe offload) is asked for where the cluster sells it as a GRES."""
    request, profile, res = plan.settled.request, plan.settled.profile, plan.resources
    if profile.scheduler != "slurm":
        return ()
    lines: list[tuple[str, str]] = [("job-name", plan.settled.job_name)]
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
