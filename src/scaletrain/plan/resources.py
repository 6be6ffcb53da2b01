"""Stage 2, resources: a ``Settled`` record becomes an ``Allocation``. Pure: no I/O, no clock.

Nodes and GPUs, the partition, tasks, CPUs, memory, time, node-local disk, the --requeue warning
and CPU binding, in the order each needs the ones before it. The arithmetic lives in
``scaletrain.plan.layout``, node-local disk in ``scaletrain.plan.disk``; the cluster's limits in
one check shared with ``lint`` (``scaletrain.clusters.resources``), which refuses a job here with
its first error and turns its warnings into notes.
"""

from __future__ import annotations

from scaletrain.clusters.model import format_time, parse_time
from scaletrain.clusters.resources import ERROR, Resources, billed_gpu_hours
from scaletrain.contract.environ import TIME_LIMIT_SIGNAL
from scaletrain.errors import PlanError, UsageError
from scaletrain.plan import disk, layout
from scaletrain.plan.launchers import SPECS
from scaletrain.plan.records import Allocation, Settled
from scaletrain.plan.values import MAX_COUNT
from scaletrain.slurm.parse import srun_cpus_export

# Seconds of warning before the time limit when --requeue is asked (a checkpoint must fit).
REQUEUE_WARNING_S = 300
# How many times a job requeues itself before it gives up (a crash loop must end).
MAX_REQUEUES = 5


def plan_resources(settled: Settled) -> Allocation:
    """What the job asks of the cluster: nodes, partition, tasks, CPUs, memory, time, disk.

    Raises UsageError for contradictory flags, ProfileError for an unknown partition, and
    PlanError (exit 2, with a hint) for a job the cluster cannot run as asked.
    """
    request, profile = settled.request, settled.profile
    seconds = parse_time(request.time or profile.default_time)
    if seconds <= 0:
        raise UsageError(f"--time {request.time!r} must be longer than zero", "e.g. --time 01:00:00")
    # the layout: nodes and GPUs, the partition, tasks, CPUs, memory, binding
    named = profile.partition(request.partition) if request.partition else None
    nodes, gpn, notes = layout.nodes_and_gpus(request, profile, named, seconds)
    if nodes * gpn > MAX_COUNT:
        raise PlanError(f"{nodes} nodes x {gpn} GPUs is more than {MAX_COUNT:,} GPUs", "ask for a real job's size")
    part = named or layout.choose_partition(profile, nodes=nodes, gpn=gpn, seconds=seconds)
    spec = SPECS[request.launcher]
    per_node = spec.per_node or profile.scheduler == "none"
    tasks, gpt, procs = layout.tasks(request, profile, per_node=per_node, gpn=gpn)
    if spec.one_process:   # the task is the node's only process; it drives every GPU itself
        procs = tasks
    cpus = layout.cpus_per_task(request, profile, tasks_per_node=tasks, gpn=gpn, whole_node=part.whole_node)
    mem, mem_gb = layout.memory(request, profile, gpn=gpn, cpus=cpus * tasks)
    owns = part.whole_node or request.exclusive or cpus * tasks >= profile.cores_per_node
    bind, bind_note = layout.cpu_bind(profile, per_node=per_node, tasks_per_node=tasks,
                                      cpus_per_task=cpus, owns_node=owns)
    launch_notes = layout.launch_notes(request.launcher, nodes, gpn)
    part_name = None if part.implicit else part.name
    family, whole = layout.partition_family(profile, part_name), gpn == layout.slots(profile)
    # the cluster's limits: the first error refuses the job, the warnings become notes
    res = Resources(nodes=nodes, gpus_per_node=gpn if profile.gpus_per_node else 0, tasks_per_node=tasks,
                    cpus_per_task=cpus, mem_gb=mem_gb, seconds=seconds, partition=part.name,
                    account=request.account)
    found = res.check(profile)
    errors = [v for v in found if v.severity == ERROR]
    if errors:
        raise PlanError(errors[0].message, errors[0].hint)
    notes += [f"{v.message} ({v.hint})" for v in found]
    if part.access:
        notes.append(f"partition {part.name}: {part.access}")
    # node-local disk: staged data and NVMe offload share the node's one request
    in_scratch = disk.venv_in_scratch(request, profile)
    stage = disk.stage_plan(request, profile, job_mem_gb=disk.job_memory_gb(profile, mem_gb, gpn),
                            venv_in_scratch=in_scratch)
    nvme = disk.nvme_disk(request, profile, nodes=nodes) if request.deepspeed_config == "nvme" else None
    disk_gb = ((stage.disk_gb or 0) if stage else 0) + (nvme or 0) or None
    signal_s = None
    if request.requeue:
        signal_s = REQUEUE_WARNING_S if seconds >= 6 * REQUEUE_WARNING_S else max(30, seconds // 6)
        notes.append(f"{TIME_LIMIT_SIGNAL} reaches the batch shell {signal_s} s before the limit; it is passed to "
                     f"every task and the job requeues itself (at most {MAX_REQUEUES} times)")
    notes += [n for n in (bind_note, *launch_notes) if n]
    return Allocation(
        partition=part_name, partition_family=family, nodes=nodes,
        gpus_per_node=gpn, gpus=nodes * gpn, tasks_per_node=tasks, ntasks=tasks * nodes, gpus_per_task=gpt,
        procs_per_node=procs, world_size=procs * nodes, cpus_per_task=cpus,
        threads_per_proc=max(1, cpus * tasks // procs), mem=mem, mem_per_proc_gb=(mem_gb / procs) if mem_gb else None,
        time=format_time(seconds), time_seconds=seconds, gpu_hours=billed_gpu_hours(res, profile),
        device="cpu" if profile.gpu_vendor == "none" or gpn == 0 else request.device,
        whole_nodes=whole, exclusive_nodes=part.whole_node, signal_seconds=signal_s,
        max_requeues=MAX_REQUEUES, stage=stage, disk_gb=disk_gb, venv_in_scratch=in_scratch, cpu_bind=bind,
        srun_cpus_export=srun_cpus_export(profile.slurm_version), requests_gpus=profile.gpus_per_node > 0,
        notes=tuple(notes))


__all__ = ["MAX_REQUEUES", "REQUEUE_WARNING_S", "plan_resources"]
