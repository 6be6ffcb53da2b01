"""What a job takes from a cluster, and the one check of it against the cluster's limits.

``Resources`` is the allocation in Slurm's terms (nodes, GPUs and tasks per node, CPUs per task,
memory per node, time, partition). ``Resources.check(profile)`` returns every limit it breaks as
a ``Violation``; ``scaletrain plan`` refuses a job with an error violation (and prints the
warnings as notes), ``scaletrain lint`` turns each violation into a finding of the same rule.
One function, so the planner and the linter can never disagree about a limit.

``billed_gpu_hours`` applies the profile's billing rule, so the figure ``plan`` prints is what
the project is charged, not just GPUs x hours; ``billing_text`` says it in the centre's unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scaletrain.slurm.parse import format_time

if TYPE_CHECKING:
    from scaletrain.clusters.profile import ClusterProfile, Partition

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One limit a job breaks. ``rule`` is the lint rule id; ``field`` the request value at fault."""

    rule: str        # "gpus-per-node" | "partition-limit" | "time-limit" | "cpu-limit" | "mem-limit" | "gpu-share"
    severity: str    # ERROR: the job would be refused or never start; WARNING: it runs, but wastefully
    field: str       # "gpus" | "nodes" | "time" | "cpus" | "mem" | "partition"
    message: str
    hint: str        # in the words of plan's flags
    sbatch_hint: str = ""   # in #SBATCH terms, for lint (defaults to ``hint``)


@dataclass(frozen=True, kw_only=True)
class Resources:
    """An allocation in Slurm's terms. ``mem_gb`` is per node (0 = the whole node, None = not asked)."""

    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    cpus_per_task: int
    mem_gb: float | None = None
    seconds: int | None = None
    partition: str | None = None
    account: str | None = None   # the node limit may depend on it (Trillium: def- accounts take 5 nodes)

    @property
    def gpus(self) -> int:
        """GPUs of the whole job."""
        return self.nodes * self.gpus_per_node

    @property
    def cpus_per_node(self) -> int:
        """CPU cores the job takes on each node."""
        return self.cpus_per_task * self.tasks_per_node

    def check(self, profile: ClusterProfile) -> list[Violation]:
        """Every limit of ``profile`` (and of the partition, when the profile knows it) broken."""
        out: list[Violation] = []
        part = profile.partitions.get(self.partition) if self.partition else None
        out += _node_limits(self, profile, part)
        if part is not None:
            out += _partition_limits(self, profile, part)
            out += _allocation_limit(self, profile, part)
        out += _gpu_share(self, profile, part)
        return out


def _s(n: int) -> str:
    return "s" if n != 1 else ""


def _v(rule: str, severity: str, field: str, message: str, hint: str, sbatch_hint: str = "") -> Violation:
    return Violation(rule=rule, severity=severity, field=field, message=message, hint=hint,
                     sbatch_hint=sbatch_hint or hint)


def _node_limits(r: Resources, prof: ClusterProfile, part: Partition | None) -> list[Violation]:
    out = []
    per = prof.gpus_per_node
    cores = part.cores_per_node if part is not None and part.cores_per_node else prof.cores_per_node
    if r.gpus_per_node and per <= 0:
        out.append(_v("gpus-per-node", ERROR, "gpus",
                      f"{r.gpus_per_node} GPUs per node requested but {prof.name} nodes have no GPUs",
                      "remove the GPU request, or use the cluster the job is meant for"))
    elif r.gpus_per_node > per > 0:
        nodes = -(-r.gpus // per)
        out.append(_v("gpus-per-node", ERROR, "gpus",
                      f"{r.gpus_per_node} GPUs per node requested but a {prof.name} node has {per}",
                      f"use {nodes} nodes with {per} GPUs each", f"use --nodes={nodes} with {per} GPUs per node"))
    if cores > 0 and r.cpus_per_node > cores:
        fit = max(1, cores // max(1, r.tasks_per_node))
        out.append(_v("cpu-limit", ERROR, "cpus",
                      f"{r.cpus_per_node} CPUs per node requested ({r.cpus_per_task} per task x "
                      f"{r.tasks_per_node} task{_s(r.tasks_per_node)}) but a {prof.name} node has "
                      f"{cores}",
                      f"ask {fit} CPUs per task or fewer (--cpus-per-gpu)", f"#SBATCH --cpus-per-task={fit}"))
    if r.mem_gb and prof.mem_per_node_gb > 0 and r.mem_gb > prof.mem_per_node_gb + 1e-6:
        out.append(_v("mem-limit", ERROR, "mem",
                      f"{r.mem_gb:g}G per node requested but a {prof.name} node gives at most "
                      f"{prof.mem_per_node_gb:g}G",
                      f"ask {prof.mem_per_node_gb:g}G per node or less (--mem-per-gpu)",
                      f"#SBATCH --mem={int(prof.mem_per_node_gb)}G (or --mem=0 for the whole node's memory)"))
    return out


def _partition_limits(r: Resources, prof: ClusterProfile, part: Partition) -> list[Violation]:
    out = []
    gpu_parts = [p for p in prof.partitions.values() if p.gpus and not p.test]
    if r.gpus_per_node and not part.gpus:
        names = ", ".join(p.name for p in gpu_parts) or "(none)"
        out.append(_v("partition-limit", ERROR, "partition",
                      f"GPUs requested in partition '{part.name}', which has no GPUs",
                      f"use a GPU partition: {names}"))
    if part.max_gpus is not None and r.gpus > part.max_gpus:
        bigger = [p.name for p in gpu_parts if p is not part and (p.max_gpus is None or p.max_gpus >= r.gpus)]
        out.append(_v("partition-limit", ERROR, "gpus",
                      f"{r.gpus} GPUs in partition '{part.name}', which allows at most {part.max_gpus}",
                      f"use --partition {bigger[0]}, or leave --partition out" if bigger else
                      f"ask for at most {part.max_gpus} GPUs",
                      f"use --partition={bigger[0]}" if bigger else f"ask for at most {part.max_gpus} GPUs"))
    if part.min_gpus is not None and 0 < r.gpus < part.min_gpus:
        smaller = [p.name for p in gpu_parts if p is not part and (p.min_gpus or 0) <= r.gpus
                   and (p.max_gpus is None or r.gpus <= p.max_gpus)]
        out.append(_v("partition-limit", ERROR, "gpus",
                      f"{r.gpus} GPU{_s(r.gpus)} in partition '{part.name}', which takes at least {part.min_gpus}",
                      f"use --partition {smaller[0]}, or leave --partition out" if smaller else
                      f"ask for {part.min_gpus} GPUs or more",
                      f"use --partition={smaller[0]}" if smaller else f"ask for {part.min_gpus} GPUs or more"))
    if part.max_nodes is not None and r.nodes > part.max_nodes:
        out.append(_v("partition-limit", ERROR, "nodes",
                      f"{r.nodes} nodes in partition '{part.name}', which allows at most {part.max_nodes}",
                      "ask for fewer GPUs, or another partition",
                      f"use at most --nodes={part.max_nodes}, or another partition"))
    if part.min_nodes is not None and r.nodes < part.min_nodes:
        out.append(_v("partition-limit", ERROR, "nodes",
                      f"{r.nodes} node(s) in partition '{part.name}', which needs at least {part.min_nodes}",
                      "ask for more GPUs, or a partition for small jobs",
                      f"use --nodes={part.min_nodes} or more, or a partition for small jobs"))
    per = prof.gpus_per_node
    if part.whole_node and per > 0 and 0 < r.gpus_per_node < per:
        shared = [p.name for p in gpu_parts if not p.whole_node]
        tests = [p for p in prof.partitions.values() if p.gpus and p.test and p.name != part.name]
        other = (f", or use --partition {shared[0]}" if shared else
                 f", or for a short test --partition {tests[0].name}" + (f" (up to {tests[0].max_time})"
                                                                          if tests[0].max_time else "")
                 if tests and not part.test else "")
        out.append(_v("partition-limit", WARNING, "partition",
                      f"partition '{part.name}' allocates whole nodes: {r.gpus_per_node} of {per} GPUs per "
                      f"node are used, and the job is billed for {per} GPUs per node",
                      f"ask for {per} GPUs per node" + other,
                      f"ask for {per} GPUs per node, or use a partition that shares nodes"))
    if r.seconds is not None and part.max_seconds is not None and r.seconds > part.max_seconds:
        out.append(_v("time-limit", ERROR, "time",
                      f"--time={format_time(r.seconds)} is above the {part.max_time} maximum of partition "
                      f"'{part.name}'; the job would never start",
                      f"ask --time {part.max_time} or less (checkpoint, and --requeue to continue)",
                      f"#SBATCH --time={part.max_time} (checkpoint and resubmit for longer runs)"))
    return out


def _allocation_limit(r: Resources, prof: ClusterProfile, part: Partition) -> list[Violation]:
    """The smaller node limit of an account without an allocation (Trillium: 5 nodes on def-)."""
    limit = part.max_nodes_no_allocation
    if limit is None or r.nodes <= limit:
        return []
    kinds = "/".join(prof.no_allocation_accounts) or "default"
    with_one = f" ({part.max_nodes} with one)" if part.max_nodes else ""
    if r.account is None:
        # the scheduler picks the group's allocation if it has one (Trillium), else the default account
        return [_v("partition-limit", WARNING, "nodes",
                   f"{r.nodes} nodes on {prof.name} need an allocation: an account without one ({kinds}) "
                   f"takes at most {limit}{with_one}",
                   f"name your allocation's account with --account, or ask for {limit} nodes or fewer",
                   f"#SBATCH --account=<your allocation's account>, or at most --nodes={limit}")]
    if not r.account.startswith(prof.no_allocation_accounts):
        return []
    return [_v("partition-limit", ERROR, "nodes",
               f"{r.nodes} nodes on account {r.account}, which has no allocation: {prof.name} allows it at most "
               f"{limit} nodes{with_one}",
               f"ask for {limit} nodes or fewer, or use an account with an allocation (--account)",
               f"use at most --nodes={limit}, or an account with an allocation")]


def _gpu_share(r: Resources, prof: ClusterProfile, part: Partition | None) -> list[Violation]:
    """The per-GPU share of cores and memory the centre allows (or bills beyond)."""
    if r.gpus_per_node <= 0 or prof.gpus_per_node <= 0 or (part is not None and part.whole_node):
        return []
    out = []
    cores_cap, mem_cap = prof.max_cores_per_gpu, prof.max_mem_per_gpu_gb
    severity = ERROR if prof.gpu_share_policy == "enforced" else WARNING
    effect = "the job is refused" if severity == ERROR else "the job is billed for the larger share"
    # beyond the node itself, cpu-limit/mem-limit already say so
    if cores_cap and cores_cap * r.gpus_per_node < r.cpus_per_node <= prof.cores_per_node:
        out.append(_v("gpu-share", severity, "cpus",
                      f"{r.cpus_per_node} cores for {r.gpus_per_node} GPU{_s(r.gpus_per_node)} per node: "
                      f"{prof.name} allows {cores_cap} per GPU ({effect})",
                      f"ask --cpus-per-gpu {cores_cap} or fewer",
                      f"#SBATCH --cpus-per-task={cores_cap * r.gpus_per_node // max(1, r.tasks_per_node)}"))
    if mem_cap and r.mem_gb and mem_cap * r.gpus_per_node + 1e-6 < r.mem_gb <= prof.mem_per_node_gb + 1e-6:
        out.append(_v("gpu-share", severity, "mem",
                      f"{r.mem_gb:g}G of memory for {r.gpus_per_node} GPU{_s(r.gpus_per_node)} per node: "
                      f"{prof.name} allows {mem_cap:g}G per GPU ({effect})",
                      f"ask --mem-per-gpu {mem_cap:g}G or less",
                      f"#SBATCH --mem={mem_cap * r.gpus_per_node:g}G"))
    return out


def billed_gpu_hours(r: Resources, profile: ClusterProfile) -> float:
    """GPU-hours the project is charged for ``r`` under the profile's billing rule.

    ``gpus``: GPUs x hours. Whole-node partitions bill every GPU of each node. ``max_share``
    (LUMI, Alliance): per node, the largest of GPUs, cores / the per-GPU core share and
    memory / the per-GPU memory share, rounded up. A billed GPU-hour may be several of the
    profile's GPUs (``gpus_per_billing_unit``: LUMI bills one MI250X = 2 GCDs, 4 per node-hour).
    """
    if profile.gpus_per_node <= 0 or r.gpus_per_node <= 0 or r.seconds is None:
        return 0.0   # no GPUs: a CPU-only job is billed in core-hours, not here
    hours = r.seconds / 3600
    part = profile.partitions.get(r.partition) if r.partition else None
    if (part is not None and part.whole_node) or profile.mem_request == "whole_node":
        per_node = float(profile.gpus_per_node)
    else:
        per_node = float(r.gpus_per_node)
        if profile.billing == "max_share":
            cores = profile.max_cores_per_gpu or profile.cores_per_gpu
            mem = profile.max_mem_per_gpu_gb or profile.mem_per_gpu
            share = max(r.cpus_per_node / cores, (r.mem_gb or 0) / mem if mem else 0.0)
            # LUMI bills whole slices of 8 cores or 64 GB; the Alliance counts a fraction of a bundle
            # ("This job request will be counted as 1.66 RGU equivalents")
            per_node = max(per_node, share if profile.billing_unit == "bundles" else math.ceil(share - 1e-9))
    return round(r.nodes * per_node * hours / max(1, profile.gpus_per_billing_unit), 2)


def billed_amount(device_hours: float, profile: ClusterProfile) -> tuple[float, str]:
    """``device_hours`` (GPUs, or LUMI's GCDs, times hours) as the centre counts them, with the unit's
    short name: bundle-hours (the Alliance), GPU BU (CSC), core-h (JSC), GPU-hours of
    ``gpus_per_billing_unit`` devices (LUMI: one billed GPU-hour is two GCDs)."""
    unit, rate = profile.billing_unit, profile.billing_rate
    if unit == "bundles":
        return device_hours, "bundle-h"
    if unit == "GPU BU" and rate:
        return device_hours * rate, "GPU BU"
    if unit == "core-h" and rate:
        return device_hours * rate, "core-h"
    return device_hours / max(profile.gpus_per_billing_unit, 1), "GPU-h"


def billing_text(gpu_hours: float, used: float, profile: ClusterProfile) -> str:
    """What a job's ``gpu_hours`` (billed GPU-hours, ``used`` for its GPUs alone) cost, in the unit
    the centre counts: GPU-hours (LUMI: of ``gpus_per_billing_unit`` GCDs), bundles (the Alliance:
    one GPU with its share of cores and memory, worth ``billing_rate`` RGUs), GPU BU (CSC) or
    core-h (JSC: ``billing_rate`` cores per GPU, with the GPU-hours beside them)."""
    unit, rate = profile.billing_unit, profile.billing_rate
    more = abs(used - gpu_hours) > 0.005
    if unit == "bundles":
        cores = profile.max_cores_per_gpu or profile.cores_per_gpu
        mem = profile.max_mem_per_gpu_gb or profile.mem_per_gpu
        text = (f"{gpu_hours:g} bundle-hours billed (a bundle: 1 {profile.gpu_model}, {cores} cores, {mem:g}G"
                + (f"; {rate:g} RGU each: {round(gpu_hours * rate, 2):g} RGU-equivalent hours" if rate else "") + ")")
        return text + (f" ({used:g} for the GPUs alone)" if more else "")
    if unit == "GPU BU" and rate:
        return (f"{round(gpu_hours * rate, 2):g} GPU BU billed ({gpu_hours:g} GPU-hours x {rate:g} BU)"
                + (f" ({used:g} GPU-hours used)" if more else ""))
    if unit == "core-h" and rate:
        # the centre assigns quota in core-h; how a GPU node's hour converts is the profile's reading
        # (its unconfirmed billing_rate), so the GPU-hours are said beside it
        return (f"{round(gpu_hours * rate, 2):g} core-h billed ({gpu_hours:g} GPU-hours x {rate:g} cores per GPU; "
                f"the conversion is unconfirmed, see 'scaletrain clusters show {profile.name}')"
                + (f" ({used:g} GPU-hours used)" if more else ""))
    per = profile.gpus_per_billing_unit
    return (f"{gpu_hours:g} GPU-hours billed" + (f" ({used:g} used)" if more else "")
            + (f" (one billed GPU-hour = {per} {profile.gpu_model}s for an hour)" if per > 1 else ""))
