"""What a plan means, for people (``render_summary``) and for programs (``plan_to_dict``): both read
the records of the plan's stages, and decide nothing.

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
from scaletrain.plan.records import Plan

# The strategies whose layout the world size alone decides (the plan knows no more).
TABLE_STRATEGIES: tuple[str, ...] = tuple(name for name, spec in STRATEGIES.items() if world_sized(spec))
# Activations, buffers and the allocator need room too: a strategy "fits" at 80% of the device.
FIT_FRACTION = 0.8


def _precision_for(plan: Plan) -> str:
    # V100/P100 have no bf16 arithmetic worth using: mixed precision there means fp16.
    model = plan.settled.profile.gpu_model.upper()
    if plan.resources.device == "cpu" or plan.settled.profile.gpu_vendor == "none":
        return "fp32"
    return "fp16" if model.startswith(("V100", "P100")) else "bf16"


def memory_rows(plan: Plan, n_params: float, *, precision: str | None = None,
                optimizer: str = "adam") -> list[dict[str, Any]]:
    """One row per strategy: bytes per GPU (device), host bytes, and whether it fits."""
    from scaletrain.parallel.memory import estimate_memory

    prec = precision or _precision_for(plan)
    device_bytes = plan.settled.profile.gpu_memory_gb * 1024 ** 3
    world = plan.resources.world_size
    rows = []
    for strategy in TABLE_STRATEGIES:
        est = estimate_memory(int(n_params), optimizer=optimizer, precision=prec, strategy=strategy,
                              world_size=max(1, world))
        fits = bool(device_bytes) and est.total <= FIT_FRACTION * device_bytes
        rows.append({"strategy": strategy, "precision": prec, "optimizer": optimizer,
                     "world_size": world, "device_bytes": est.total, "host_bytes": est.host,
                     "params_bytes": est.params, "grads_bytes": est.grads,
                     "optimizer_bytes": est.optimizer_state, "fits": fits})
    return rows


def _gib(n: float) -> str:
    return f"{n / 1024 ** 3:,.1f} GiB"


def memory_table(plan: Plan, n_params: float) -> str:
    """A text table of per-GPU model-state memory per strategy (activations not included)."""
    rows = memory_rows(plan, n_params)
    dev = plan.settled.profile.gpu_memory_gb
    head = (f"model state per GPU for {n_params:.3g} parameters, Adam, {rows[0]['precision']}, "
            f"{plan.resources.world_size} GPUs ({plan.settled.profile.gpu_model}, {dev:g} GB each; "
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
    prof, res, launcher = plan.settled.profile, plan.resources, plan.settled.request.launcher
    facts = prof.unconfirmed_facts
    if not facts or prof.scheduler != "slurm":
        return []
    relied = set(_RELIED)
    relied |= ({"container", "container_setup_lines", "container_binds", "default_image"} if plan.software.container
               else {"tensorflow_setup_lines", "python_env_lines"}
               if launcher == "tensorflow" and prof.tensorflow_setup_lines
               else {"setup_lines", "python_env_lines", "wheels"})
    relied.add(f"wheels.{launcher}")
    if res.disk_gb or any(f.scratch for f in plan.files.job_files):
        relied |= {"scratch_var", "scratch_max_gb", "scratch_in_memory"}
    if res.cpu_bind or any(k == GPU_CPU_MAP_VAR for k, _ in plan.software.env):
        relied.add("gpu_cpu_map")
    if res.stage is not None:
        relied |= {"scratch_var", "scratch_max_gb", "scratch_gres"}
    part = res.partition or next((n for n, p in prof.partitions.items() if p.implicit), "")
    out = []
    for key, why in facts.items():
        head, _, rest = key.partition(".")
        used = key in relied or (head == "partitions" and (not rest or rest.split(".")[0] == part))
        if used:
            out.append((key, why))
    return out


def render_summary(plan: Plan) -> str:
    """A few lines for stderr: layout, per-process resources, partition, GPU-hours, notes."""
    p, prof, request = plan.resources, plan.settled.profile, plan.settled.request
    lines: list[str] = []
    if prof.scheduler != "slurm":
        lines.append(f"scaletrain plan: {p.world_size} CPU worker process{'es' if p.world_size != 1 else ''} "
                     f"on this machine ({prof.cores_per_node} cores), {p.threads_per_proc} "
                     f"thread{'s' if p.threads_per_proc != 1 else ''} each")
    else:
        part = p.partition or "(chosen by Slurm)"
        nodes = f"{p.nodes} node{'s' if p.nodes != 1 else ''}"
        gpus = (f" x {p.gpus_per_node} {prof.gpu_model} = {p.gpus} GPU{'s' if p.gpus != 1 else ''}"
                if p.requests_gpus else " without GPUs (the script requests none: a CPU-only cluster)")
        lines.append(f"scaletrain plan: {prof.name}, partition {part}: {nodes}{gpus}, "
                     f"{p.world_size} process{'es' if p.world_size != 1 else ''} ({request.launcher})")
        # in G like the node figures beside it (the script keeps Slurm's exact MiB form)
        mem = f", {p.mem_per_proc_gb:.1f}G memory".replace(".0G", "G") if p.mem_per_proc_gb else ""
        per = p.gpus_per_node / p.procs_per_node
        share = f"{per:g} GPU{'s' if per > 1 else ''}" if p.gpus_per_node and p.requests_gpus else "no GPU"
        lines.append(f"  per process: {share}, {p.threads_per_proc} CPU core{'s' if p.threads_per_proc != 1 else ''}"
                     f"{mem}; Slurm tasks: {p.tasks_per_node} per node x {p.cpus_per_task} CPUs"
                     + (f", --mem={p.mem}" if p.mem else ""))
        if p.requests_gpus:
            used = p.gpus * p.time_seconds / 3600 / prof.gpus_per_billing_unit
            lines.append(f"  time {p.time} -> {billing_text(p.gpu_hours, used, prof)}")
        else:   # a CPU-only cluster: no GPU unit to bill in
            lines.append(f"  time {p.time} -> 0 GPU-hours billed")
    if p.device == "cpu" and prof.scheduler == "slurm":
        lines.append(f"  device: cpu ({DEVICE_VAR}=cpu; GPUs, if any, are left unused)")
    if p.stage is not None:
        lines.append(f"  data: {p.stage.source} -> {p.stage.scratch_var}/{p.stage.dest_name} on each node "
                     f"(${DATA_VAR})"
                     + (f", {p.stage.disk_gb} GB node-local disk requested" if p.stage.disk_gb else ""))
    if prof.scheduler == "slurm" and plan.software.description:
        lines.append(f"  software: {plan.software.description}")
    for note in notes(plan):
        lines.append(f"  note: {note}")
    for warning in plan.software.warnings:
        lines.append(f"  warning: {warning}")
    doubtful = unconfirmed_relied(plan)
    for key, why in doubtful:
        lines.append(f"  unconfirmed: {key} - {why}")
    if doubtful:
        lines.append(f"  (the plan relies on {len(doubtful)} unconfirmed fact{'s' if len(doubtful) != 1 else ''}: "
                     f"compare with Slurm on {prof.name} by running 'scaletrain clusters check' there)")
    if request.params:
        lines.append(memory_table(plan, request.params))
    return "\n".join(lines)


def notes(plan: Plan) -> tuple[str, ...]:
    """The notes of every stage, in the order the stages ran."""
    return (*plan.resources.notes, *plan.software.notes, *plan.files.notes)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data (the profile by name and path, the launch line included): one
    flat object, its keys in the order ``plan --json`` has always written them."""
    from scaletrain.plan.render import exports, launch_command, program_line, sbatch_options, setup_lines

    settled, res, sw, files = plan.settled, plan.resources, plan.software, plan.files
    request, profile = settled.request, settled.profile
    out: dict[str, Any] = {
        "request": asdict(request), "cluster": profile.name, "partition": res.partition,
        "partition_family": res.partition_family, "nodes": res.nodes, "gpus_per_node": res.gpus_per_node,
        "gpus": res.gpus, "launcher": request.launcher, "tasks_per_node": res.tasks_per_node, "ntasks": res.ntasks,
        "gpus_per_task": res.gpus_per_task, "procs_per_node": res.procs_per_node, "world_size": res.world_size,
        "cpus_per_task": res.cpus_per_task, "threads_per_proc": res.threads_per_proc, "mem": res.mem,
        "mem_per_proc_gb": res.mem_per_proc_gb, "time": res.time, "time_seconds": res.time_seconds,
        "gpu_hours": res.gpu_hours, "account": request.account, "device": res.device,
        "whole_nodes": res.whole_nodes, "exclusive_nodes": res.exclusive_nodes, "requeue": request.requeue,
        "signal_seconds": res.signal_seconds, "max_requeues": res.max_requeues,
        "stage": asdict(res.stage) if res.stage else None, "cpu_bind": res.cpu_bind,
        "sbatch": [[k, v] for k, v in sbatch_options(plan)], "env": dict(exports(plan)),
        "notes": notes(plan), "scheduler": profile.scheduler, "job_name": request.slurm_job_name,
        "command": request.command, "setup": setup_lines(plan), "python": sw.python,
        "container": sw.container, "exec_wrapper": sw.exec_wrapper, "program_words": program_line(plan),
        "check_scaletrain": sw.check_scaletrain, "master_addr_suffix": profile.master_addr_suffix,
        "accelerate_config": files.accelerate_config, "job_files": [asdict(f) for f in files.job_files],
        "files_dir": request.files_dir or None, "disk_gb": res.disk_gb, "image": settled.image,
        "software": sw.description, "warnings": sw.warnings, "sample_gpus": request.sample_gpus,
        "srun_cpus_export": res.srun_cpus_export, "requests_gpus": res.requests_gpus,
        "profile": {"name": profile.name, "path": profile.path}, "launch": launch_command(plan),
        "unconfirmed": [{"fact": k, "why": w} for k, w in unconfirmed_relied(plan)],
    }
    if request.params:
        out["memory"] = memory_rows(plan, request.params)
    return out
