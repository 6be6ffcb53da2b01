"""Rules that compare the request with the cluster profile: GPUs, partitions, cores, memory, time.

Node-size rules are errors on a partition the profile knows. On a partition it does not know
(the seeds use LUMI's historical ``eap``), the node may not be the profile's node, so the same
finding is a warning that says so.
"""

from __future__ import annotations

import re
from typing import Iterable

from scaletrain.lint.findings import ERROR, WARNING, Finding, LintContext, finding, rule
from scaletrain.lint.job import parse_time_s
from scaletrain.slurm.parse import format_time


def _node_severity(ctx: LintContext) -> tuple[str, str]:
    if ctx.partition_known:
        return ERROR, ""
    return WARNING, f" (partition '{ctx.job.partition}' is not in the {ctx.profile.name} profile; its nodes may differ)"  # type: ignore[union-attr]


def _gpu_line(ctx: LintContext) -> int:
    return ctx.job.gpus[0].line if ctx.job.gpus else ctx.option_line("nodes", "ntasks")


def _gpu_syntax_hint(ctx: LintContext, count: int | None) -> str:
    prof = ctx.profile
    if prof is None:
        return ""
    n = count if count else 1
    if prof.gpu_request == "gres_typed" and prof.gres_type:
        return f"#SBATCH --gres=gpu:{prof.gres_type}:{n}"
    if prof.gpu_request == "gres":
        return f"#SBATCH --gres=gpu:{n}"
    return f"#SBATCH --gpus-per-node={n}"


@rule("gpus-per-node", "more GPUs per node than the cluster's nodes have", needs_cluster=True)
def gpus_per_node(ctx: LintContext) -> Iterable[Finding]:
    prof = ctx.profile
    gpn = ctx.job.gpus_per_node
    if prof is None or not gpn:
        return
    if prof.gpus_per_node <= 0:
        yield finding("gpus-per-node", ERROR, _gpu_line(ctx),
                      f"{gpn} GPUs per node requested but {prof.name} nodes have no GPUs",
                      "remove the GPU request, or lint with the --cluster the job is meant for")
        return
    if gpn > prof.gpus_per_node:
        sev, note = _node_severity(ctx)
        nodes = -(-gpn * ctx.job.node_count // prof.gpus_per_node)
        yield finding("gpus-per-node", sev, _gpu_line(ctx),
                      f"{gpn} GPUs per node requested but a {prof.name} node has {prof.gpus_per_node}{note}",
                      f"use --nodes={nodes} with {prof.gpus_per_node} GPUs per node "
                      f"({_gpu_syntax_hint(ctx, prof.gpus_per_node)})")


def _form(option: str, gpu_type: str | None) -> str:
    """The profile's name for a request form (see ``ClusterProfile.gpu_request_accepts``)."""
    if option == "gres":
        return "gres_typed" if gpu_type else "gres"
    return {"gpus-per-task": "gpus_per_task"}.get(option, "gpus_per_node")


@rule("gpu-syntax", "a GPU request in a form or type the cluster does not accept", needs_cluster=True)
def gpu_syntax(ctx: LintContext) -> Iterable[Finding]:
    prof = ctx.profile
    if prof is None or prof.gpus_per_node <= 0:
        return
    gres_type = (prof.gres_type or "").lower()
    accepts = tuple(getattr(prof, "gpu_request_accepts", ()) or ())
    for spec in ctx.job.gpus:
        hint = _gpu_syntax_hint(ctx, spec.count if spec.option != "gpus-per-task" else ctx.job.gpus_per_node)
        if spec.gpu_type and spec.gpu_type.lower() != gres_type:
            if not gres_type:
                # the profile names no GRES type: a type matching the GPU model (LUMI's mi250)
                # may well be configured, so only an unrelated name is worth a warning
                model = re.sub(r"[^a-z0-9]", "", prof.gpu_model.lower())
                if re.sub(r"[^a-z0-9]", "", spec.gpu_type.lower()) not in model:
                    # sbatch refuses a GRES type no node has ("Invalid generic resource")
                    yield finding("gpu-syntax", ERROR, spec.line,
                                  f"GPU type '{spec.gpu_type}' does not exist on {prof.name} (its GPUs are "
                                  f"{prof.gpu_model}): sbatch refuses the job", hint)
                continue
            yield finding("gpu-syntax", ERROR, spec.line,
                          f"GPU type '{spec.gpu_type}' does not exist on {prof.name} (its GPUs are of "
                          f"type '{prof.gres_type}'): the job would never start", hint)
            continue
        form = _form(spec.option, spec.gpu_type)
        if accepts and form not in accepts:
            written = {"gres_typed": f"--gres=gpu:{spec.gpu_type}:N", "gres": "--gres=gpu:N (no GPU type)"}
            yield finding("gpu-syntax", ERROR, spec.line,
                          f"{prof.name} does not take GPU requests written as "
                          f"{written.get(form, '--' + spec.option)}", hint)
        elif not accepts and (spec.option == "gres") != (prof.gpu_request in ("gres", "gres_typed")):
            yield finding("gpu-syntax", WARNING, spec.line,
                          f"--{spec.option} is not how {prof.name} documents GPU requests", hint)


@rule("partition-unknown", "a partition the cluster profile does not list", needs_cluster=True)
def partition_unknown(ctx: LintContext) -> Iterable[Finding]:
    prof = ctx.profile
    if prof is None or ctx.partition_known:
        return
    yield finding("partition-unknown", WARNING, ctx.option_line("partition"),
                  f"partition '{ctx.job.partition}' is not in the {prof.name} profile "
                  f"(known: {', '.join(prof.partitions)})",
                  "check the name with 'sinfo -s'; old guides name partitions that no longer exist")


@rule("partition-missing", "no --partition on a cluster whose GPU partitions must be named",
      needs_cluster=True)
def partition_missing(ctx: LintContext) -> Iterable[Finding]:
    prof = ctx.profile
    if prof is None or ctx.job.partition is not None or ctx.partition is not None or not prof.partitions:
        return
    gpu_parts = [p.name for p in prof.partitions.values() if p.gpus and not getattr(p, "test", False)]
    yield finding("partition-missing", WARNING, ctx.option_line("nodes", "ntasks", "time"),
                  f"no #SBATCH --partition: {prof.name}'s default partition may have no GPUs "
                  "(fine if SBATCH_PARTITION is set)",
                  f"#SBATCH --partition={gpu_parts[0]}" if gpu_parts else "name a partition")


@rule("partition-limit", "GPUs or nodes outside the partition's limits", needs_cluster=True)
def partition_limit(ctx: LintContext) -> Iterable[Finding]:
    prof, part, job = ctx.profile, ctx.partition, ctx.job
    if prof is None or part is None:
        return
    line = ctx.option_line("partition")
    total = job.total_gpus
    others = [p.name for p in prof.partitions.values() if p is not part and p.gpus]
    if part.max_gpus is not None and total is not None and total > part.max_gpus:
        bigger = [p.name for p in prof.partitions.values()
                  if p.gpus and not getattr(p, "test", False) and (p.max_gpus is None or p.max_gpus >= total)]
        yield finding("partition-limit", ERROR, _gpu_line(ctx),
                      f"{total} GPUs in partition '{part.name}', which allows at most {part.max_gpus}",
                      f"use --partition={bigger[0]}" if bigger else
                      f"ask for at most {part.max_gpus} GPUs")
    if part.max_nodes is not None and job.node_count > part.max_nodes:
        yield finding("partition-limit", ERROR, ctx.option_line("nodes", "partition"),
                      f"{job.node_count} nodes in partition '{part.name}', which allows at most {part.max_nodes}",
                      f"use at most --nodes={part.max_nodes}, or another partition")
    if part.min_nodes is not None and job.node_count < part.min_nodes:
        yield finding("partition-limit", ERROR, ctx.option_line("nodes", "partition"),
                      f"{job.node_count} node(s) in partition '{part.name}', which needs at least {part.min_nodes}",
                      f"use --nodes={part.min_nodes} or more, or a partition for small jobs")
    if not part.gpus and job.gpus_per_node:
        yield finding("partition-limit", ERROR, line,
                      f"GPUs requested in partition '{part.name}', which has no GPUs",
                      f"use a GPU partition: {', '.join(others)}" if others else "remove the GPU request")
    if part.whole_node and job.gpus_per_node and job.gpus_per_node < prof.gpus_per_node:
        yield finding("partition-limit", WARNING, _gpu_line(ctx),
                      f"partition '{part.name}' allocates whole nodes: {job.gpus_per_node} of "
                      f"{prof.gpus_per_node} GPUs per node are used and all are billed",
                      f"ask for {prof.gpus_per_node} GPUs per node, or use a partition that shares nodes")


@rule("time-limit", "a time limit above the partition's maximum", needs_cluster=True)
def time_limit(ctx: LintContext) -> Iterable[Finding]:
    part = ctx.partition
    if part is None or part.max_time is None or ctx.job.time_s is None:
        return
    limit = parse_time_s(part.max_time)
    if limit is not None and ctx.job.time_s > limit:
        yield finding("time-limit", ERROR, ctx.option_line("time"),
                      f"--time={format_time(ctx.job.time_s)} is above the {part.max_time} "
                      f"maximum of partition '{part.name}'; the job would never start",
                      f"#SBATCH --time={part.max_time} (checkpoint and resubmit for longer runs)")


def cpus_per_node(ctx: LintContext) -> int:
    """CPUs the request takes on each node."""
    return ctx.cpus_per_node


@rule("cpu-limit", "CPUs per task x tasks per node above the node's cores", needs_cluster=True)
def cpu_limit(ctx: LintContext) -> Iterable[Finding]:
    prof, job = ctx.profile, ctx.job
    if prof is None or prof.cores_per_node <= 0:
        return
    cpus = cpus_per_node(ctx)
    if cpus > prof.cores_per_node:
        sev, note = _node_severity(ctx)
        per = max(1, prof.cores_per_node // job.tasks_per_node)
        yield finding("cpu-limit", sev, ctx.option_line("cpus-per-task", "cpus-per-gpu", "ntasks-per-node"),
                      f"{cpus} CPUs per node requested ({job.cpus_per_task or 1} per task x "
                      f"{job.tasks_per_node} tasks) but a {prof.name} node has {prof.cores_per_node}{note}",
                      f"#SBATCH --cpus-per-task={per}")


@rule("mem-limit", "memory above what a node can give", needs_cluster=True)
def mem_limit(ctx: LintContext) -> Iterable[Finding]:
    prof, job = ctx.profile, ctx.job
    if prof is None or prof.mem_per_node_gb <= 0:
        return
    per_node_mb: float | None = None
    what = ""
    if job.mem_mb:
        per_node_mb, what = job.mem_mb, "--mem"
    elif job.mem_per_cpu_mb:
        per_node_mb, what = job.mem_per_cpu_mb * cpus_per_node(ctx), "--mem-per-cpu x CPUs per node"
    elif job.mem_per_gpu_mb and job.gpus_per_node:
        per_node_mb, what = job.mem_per_gpu_mb * job.gpus_per_node, "--mem-per-gpu x GPUs per node"
    if per_node_mb is None:
        return
    gb = per_node_mb / 1024
    if gb > prof.mem_per_node_gb + 1e-6:
        sev, note = _node_severity(ctx)
        yield finding("mem-limit", sev, ctx.option_line("mem", "mem-per-cpu", "mem-per-gpu"),
                      f"{gb:g}G per node requested ({what}) but a {prof.name} node gives at most "
                      f"{prof.mem_per_node_gb:g}G{note}",
                      f"#SBATCH --mem={int(prof.mem_per_node_gb)}G (or --mem=0 for the whole node's memory)")


@rule("account-missing", "no --account on a cluster that requires one", needs_cluster=True)
def account_missing(ctx: LintContext) -> Iterable[Finding]:
    prof = ctx.profile
    if prof is None or not prof.account_required or ctx.job.account is not None:
        return
    yield finding("account-missing", WARNING, 1,
                  f"no #SBATCH --account: {prof.name} requires one (fine if SBATCH_ACCOUNT is set)",
                  "#SBATCH --account=<project>")


@rule("master-addr-suffix", "a rendezvous host name without the cluster's fast-network suffix",
      needs_cluster=True)
def master_addr_suffix(ctx: LintContext) -> Iterable[Finding]:
    prof = ctx.profile
    suffix = getattr(prof, "master_addr_suffix", "") if prof else ""
    if not suffix or ctx.job.node_count <= 1:
        return
    for name in ("MASTER_ADDR", "RDZV_HOST"):
        entries = ctx.variables.get(name, [])
        if any(word.value.strip().endswith(suffix) for word, _cmd in entries):
            continue   # the suffix is added, perhaps on a later line: MASTER_ADDR="${MASTER_ADDR}i"
        for word, _cmd in entries:
            value = word.value.strip()
            from_host = "hostname" in value or "scontrol" in value or "SLURMD_NODENAME" in value
            if from_host and not value.endswith(suffix):
                yield finding("master-addr-suffix", WARNING, word.line,
                              f"{name} is a plain host name, but on {prof.name} the nodes reach each "  # type: ignore[union-attr]
                              f"other over the fast network by the name with '{suffix}' appended",
                              f'{name}="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1){suffix}"')
