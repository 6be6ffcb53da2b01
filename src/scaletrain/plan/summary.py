"""What a plan means, for people (``render_summary``) and for programs (``plan_to_dict``).

``memory_table`` adds, for ``plan --params N``, the model state each GPU holds under every
strategy, from ``scaletrain.parallel.memory.estimate_memory`` (which imports no torch when
given a number).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from scaletrain.clusters.resources import billing_text
from scaletrain.contract.environ import DATA_VAR, DEVICE_VAR, GPU_CPU_MAP_VAR
from scaletrain.parallel.options import STRATEGIES, world_sized
from scaletrain.plan.planner import Plan

# The strategies whose layout the world size alone decides (the plan knows no more).
TABLE_STRATEGIES: tuple[str, ...] = tuple(name for name, spec in STRATEGIES.items() if world_sized(spec))
# Activations, buffers and the allocator need room too: a strategy "fits" at 80% of the device.
FIT_FRACTION = 0.8


def _precision_for(plan: Plan) -> str:
    # V100/P100 have no bf16 arithmetic worth using: mixed precision there means fp16.
    model = plan.profile.gpu_model.upper()
    if plan.device == "cpu" or plan.profile.gpu_vendor == "none":
        return "fp32"
    return "fp16" if model.startswith(("V100", "P100")) else "bf16"


def memory_rows(plan: Plan, n_params: float, *, precision: str | None = None,
                optimizer: str = "adam") -> list[dict[str, Any]]:
    """One row per strategy: bytes per GPU (device), host bytes, and whether it fits."""
    from scaletrain.parallel.memory import estimate_memory

    prec = precision or _precision_for(plan)
    device_bytes = plan.profile.gpu_memory_gb * 1024 ** 3
    rows = []
    for strategy in TABLE_STRATEGIES:
        est = estimate_memory(int(n_params), optimizer=optimizer, precision=prec, strategy=strategy,
                              world_size=max(1, plan.world_size))
        fits = bool(device_bytes) and est.total <= FIT_FRACTION * device_bytes
        rows.append({"strategy": strategy, "precision": prec, "optimizer": optimizer,
                     "world_size": plan.world_size, "device_bytes": est.total, "host_bytes": est.host,
                     "params_bytes": est.params, "grads_bytes": est.grads,
                     "optimizer_bytes": est.optimizer_state, "fits": fits})
    return rows


def _gib(n: float) -> str:
    return f"{n / 1024 ** 3:,.1f} GiB"


def memory_table(plan: Plan, n_params: float) -> str:
    """A text table of per-GPU model-state memory per strategy (activations not included)."""
    rows = memory_rows(plan, n_params)
    dev = plan.profile.gpu_memory_gb
    head = (f"model state per GPU for {n_params:.3g} parameters, Adam, {rows[0]['precision']}, "
            f"{plan.world_size} GPUs ({plan.profile.gpu_model}, {dev:g} GB each; "
            f"'fits' leaves {100 - int(FIT_FRACTION * 100)}% for activations):")
    lines = [head, f"  {'strategy':<9}{'per GPU':>14}{'host/rank':>14}  fits"]
    for r in rows:
        host = _gib(r["host_bytes"]) if r["host_bytes"] else "-"
        lines.append(f"  {r['strategy']:<9}{_gib(r['device_bytes']):>14}{host:>14}  "
                     f"{'yes' if r['fits'] else 'no'}")
    return "\n".join(lines)


# Profile facts every Slurm plan relies on; the partition's own facts and the software's are added.
_RELIED = ("gpus_per_node", "cores_per_node", "mem_per_node_gb", "mem_per_gpu_gb", "mem_request",
           "gpu_request", "gres_type", "account_required", "env", "master_addr_suffix",
           "max_cores_per_gpu", "max_mem_per_gpu_gb", "billing", "billing_unit", "billing_rate",
           "gpus_per_billing_unit")


def unconfirmed_relied(plan: Plan) -> list[tuple[str, str]]:
    """(field, why) for each fact this plan used that the profile marks unconfirmed."""
    prof = plan.profile
    facts = prof.unconfirmed_facts
    if not facts or plan.scheduler != "slurm":
        return []
    relied = set(_RELIED)
    relied |= ({"container", "container_setup_lines", "container_binds", "default_image"} if plan.container
               else {"tensorflow_setup_lines", "python_env_lines"}
               if plan.launcher == "tensorflow" and prof.tensorflow_setup_lines
               else {"setup_lines", "python_env_lines", "wheels"})
    relied.add(f"wheels.{plan.launcher}")
    if plan.disk_gb or any(f.scratch for f in plan.job_files):
        relied |= {"scratch_var", "scratch_max_gb", "scratch_in_memory"}
    if plan.cpu_bind or any(k == GPU_CPU_MAP_VAR for k, _ in plan.env):
        relied.add("gpu_cpu_map")
    if plan.stage is not None:
        relied |= {"scratch_var", "scratch_max_gb", "scratch_gres"}
    part = plan.partition or next((n for n, p in prof.partitions.items() if p.implicit), "")
    out = []
    for key, why in facts.items():
        head, _, rest = key.partition(".")
        used = key in relied or (head == "partitions" and (not rest or rest.split(".")[0] == part))
        if used:
            out.append((key, why))
    return out


def render_summary(plan: Plan) -> str:
    """A few lines for stderr: layout, per-process resources, partition, GPU-hours, notes."""
    p = plan
    lines: list[str] = []
    if p.scheduler != "slurm":
        lines.append(f"scaletrain plan: {p.world_size} CPU worker process{'es' if p.world_size != 1 else ''} "
                     f"on this machine ({p.profile.cores_per_node} cores), {p.threads_per_proc} "
                     f"thread{'s' if p.threads_per_proc != 1 else ''} each")
    else:
        part = p.partition or "(chosen by Slurm)"
        nodes = f"{p.nodes} node{'s' if p.nodes != 1 else ''}"
        gpus = (f" x {p.gpus_per_node} {p.profile.gpu_model} = {p.gpus} GPU{'s' if p.gpus != 1 else ''}"
                if p.requests_gpus else " without GPUs (the script requests none: a CPU-only cluster)")
        lines.append(f"scaletrain plan: {p.cluster}, partition {part}: {nodes}{gpus}, "
                     f"{p.world_size} process{'es' if p.world_size != 1 else ''} ({p.launcher})")
        # in G like the node figures beside it (the script keeps Slurm's exact MiB form)
        mem = f", {p.mem_per_proc_gb:.1f}G memory".replace(".0G", "G") if p.mem_per_proc_gb else ""
        per = p.gpus_per_node / p.procs_per_node
        share = f"{per:g} GPU{'s' if per > 1 else ''}" if p.gpus_per_node and p.requests_gpus else "no GPU"
        lines.append(f"  per process: {share}, {p.threads_per_proc} CPU core{'s' if p.threads_per_proc != 1 else ''}"
                     f"{mem}; Slurm tasks: {p.tasks_per_node} per node x {p.cpus_per_task} CPUs"
                     + (f", --mem={p.mem}" if p.mem else ""))
        if p.requests_gpus:
            used = p.gpus * p.time_seconds / 3600 / p.profile.gpus_per_billing_unit
            lines.append(f"  time {p.time} -> {billing_text(p.gpu_hours, used, p.profile)}")
        else:   # a CPU-only cluster: no GPU unit to bill in
            lines.append(f"  time {p.time} -> 0 GPU-hours billed")
    if p.device == "cpu" and p.scheduler == "slurm":
        lines.append(f"  device: cpu ({DEVICE_VAR}=cpu; GPUs, if any, are left unused)")
    if p.stage is not None:
        lines.append(f"  data: {p.stage.source} -> {p.stage.scratch_var}/{p.stage.dest_name} on each node "
                     f"(${DATA_VAR})"
                     + (f", {p.stage.disk_gb} GB node-local disk requested" if p.stage.disk_gb else ""))
    if p.scheduler == "slurm" and p.software:
        lines.append(f"  software: {p.software}")
    for note in p.notes:
        lines.append(f"  note: {note}")
    for warning in p.warnings:
        lines.append(f"  warning: {warning}")
    doubtful = unconfirmed_relied(p)
    for key, why in doubtful:
        lines.append(f"  unconfirmed: {key} - {why}")
    if doubtful:
        lines.append(f"  (the plan relies on {len(doubtful)} unconfirmed fact{'s' if len(doubtful) != 1 else ''}: "
                     f"compare with Slurm on {p.cluster} by running 'scaletrain clusters check' there)")
    if p.request.params:
        lines.append(memory_table(p, p.request.params))
    return "\n".join(lines)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data (the profile by name and path, the launch line included)."""
    from scaletrain.plan.render import launch_command

    out: dict[str, Any] = {}
    for key, value in asdict(plan).items():
        if key in ("profile",):
            continue
        out[key] = value
    out["request"] = asdict(plan.request)
    out["profile"] = {"name": plan.profile.name, "path": plan.profile.path}
    out["sbatch"] = [[k, v] for k, v in plan.sbatch]
    out["env"] = dict(plan.env)
    out["launch"] = launch_command(plan)
    out["unconfirmed"] = [{"fact": k, "why": w} for k, w in unconfirmed_relied(plan)]
    if plan.request.params:
        out["memory"] = memory_rows(plan, plan.request.params)
    return out
