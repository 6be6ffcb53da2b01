"""Rules that compare the request with the cluster profile: GPUs, partitions, cores, memory, time.

The limits themselves are checked once, by ``Resources.check`` (``scaletrain.clusters.resources``),
the same function ``plan`` calls; the rules here turn its violations into findings.

Node-size rules are errors on a partition the profile knows. On a partition it does not know
(the seeds use LUMI's historical ``eap``), the node may not be the profile's node, so the same
finding is a warning that says so.
"""

from __future__ import annotations

import re
from typing import Iterable

from scaletrain.clusters.resources import Resources
from scaletrain.lint.findings import ERROR, WARNING, Finding, LintContext, finding, rule


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
    if prof.gpu_request == "gpus_per_node_typed" and prof.gres_type:
        return f"#SBATCH --gpus-per-node={prof.gres_type}:{n}"
    return f"#SBATCH --gpus-per-node={n}"


def resources(ctx: LintContext) -> Resources:
    """The script's #SBATCH request in the shared check's terms (clusters/resources.py)."""
    job = ctx.job
    gpn = job.gpus_per_node or 0
    tasks, cpt = job.tasks_per_node, job.cpus_per_task or 1
    if job.cpus_per_gpu and gpn:
        tasks, cpt = 1, job.cpus_per_gpu * gpn
    mem_mb = job.mem_mb
    if not mem_mb and job.mem_per_cpu_mb:
        mem_mb = job.mem_per_cpu_mb * tasks * cpt
    elif not mem_mb and job.mem_per_gpu_mb and gpn:
        mem_mb = job.mem_per_gpu_mb * gpn
    part = ctx.partition
    return Resources(nodes=job.node_count, gpus_per_node=gpn, tasks_per_node=tasks, cpus_per_task=cpt,
                     mem_gb=mem_mb / 1024 if mem_mb else None, seconds=job.time_s,
                     partition=part.name if part is not None else None, account=job.account)


_FIELD_LINES = {"gpus": None, "nodes": ("nodes", "partition"), "time": ("time",),
                "cpus": ("cpus-per-task", "cpus-per-gpu", "ntasks-per-node"),
                "mem": ("mem", "mem-per-cpu", "mem-per-gpu"), "partition": ("partition",)}
# Limits of the node itself: on a partition the profile does not know, the node may differ.
_NODE_RULES = ("gpus-per-node", "cpu-limit", "mem-limit")


def _shared_check(ctx: LintContext, rule_id: str) -> Iterable[Finding]:
    """Findings of ``rule_id`` from the one resource check ``plan`` also uses."""
    prof = ctx.profile
    if prof is None:
        return
    for v in resources(ctx).check(prof):
        if v.rule != rule_id:
            continue
        names = _FIELD_LINES[v.field]
        line = _gpu_line(ctx) if names is None else ctx.option_line(*names)
        severity, note = v.severity, ""
        if rule_id in _NODE_RULES and v.severity == ERROR:
            severity, note = _node_severity(ctx)
        hint = v.sbatch_hint
        if rule_id == "gpus-per-node" and prof.gpus_per_node > 0:
            hint = f"{hint} ({_gpu_syntax_hint(ctx, prof.gpus_per_node)})"
        yield finding(rule_id, severity, line, v.message + note, hint)


@rule("gpus-per-node", "more GPUs per node than the cluster's nodes have", needs_cluster=True)
def gpus_per_node(ctx: LintContext) -> Iterable[Finding]:
    yield from _shared_check(ctx, "gpus-per-node")


def _form(option: str, gpu_type: str | None) -> str:
    """The profile's name for a request form (see ``ClusterProfile.gpu_request_accepts``)."""
    if option == "gres":
        return "gres_typed" if gpu_type else "gres"
    if option == "gpus-per-node" and gpu_type:
        return "gpus_per_node_typed"
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


@rule("cluster-retired", "a script for a system that no longer runs jobs", needs_cluster=True)
def cluster_retired(ctx: LintContext) -> Iterable[Finding]:
    prof = ctx.profile
    if prof is None or not prof.retired:
        return
    succ = prof.successor or "a live system"
    yield finding("cluster-retired", WARNING, ctx.option_line("partition", "account"),
                  f"{prof.name} was retired on {prof.retired}: this script's jobs will not run there "
                  f"(successor: {succ})",
                  f"port it: scaletrain port {ctx.script.path} --cluster {succ}")


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
    yield from _shared_check(ctx, "partition-limit")


@rule("time-limit", "a time limit above the partition's maximum", needs_cluster=True)
def time_limit(ctx: LintContext) -> Iterable[Finding]:
    yield from _shared_check(ctx, "time-limit")


@rule("cpu-limit", "CPUs per task x tasks per node above the node's cores", needs_cluster=True)
def cpu_limit(ctx: LintContext) -> Iterable[Finding]:
    yield from _shared_check(ctx, "cpu-limit")


@rule("mem-limit", "memory above what a node can give", needs_cluster=True)
def mem_limit(ctx: LintContext) -> Iterable[Finding]:
    yield from _shared_check(ctx, "mem-limit")


@rule("gpu-share", "more cores or memory per GPU than the centre allows or bills as one GPU",
      needs_cluster=True)
def gpu_share(ctx: LintContext) -> Iterable[Finding]:
    yield from _shared_check(ctx, "gpu-share")


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


@rule("cpu-bind-mask", "an srun mask_cpu binding that names more or fewer CPUs than each task has")
def cpu_bind_mask(ctx: LintContext) -> Iterable[Finding]:
    """A mask outside the step's CPUs is refused by Slurm: the step never starts.

    The same fact ``plan`` uses to write LUMI's masks (``scaletrain.plan.layout.cpu_bind``):
    each task's mask names exactly its ``--cpus-per-task`` cores.
    """
    seen: set[int] = set()
    for step in ctx.steps:
        inv = step.invocation
        if inv.srun is None or step.line in seen:
            continue
        seen.add(step.line)
        m = re.search(r"mask_cpu:([0-9a-fA-FxX,]+)", inv.srun.options.get("cpu-bind") or "")
        if m is None:
            continue
        cpt = ctx.resolve_int(inv.srun.options.get("cpus-per-task")) or ctx.job.cpus_per_task
        if cpt is None:
            continue
        try:
            counts = [bin(int(mask, 16)).count("1") for mask in m.group(1).split(",") if mask]
        except ValueError:
            continue
        if any(c > cpt for c in counts):
            yield finding("cpu-bind-mask", ERROR, step.line,
                          f"--cpu-bind masks name up to {max(counts)} CPUs but each task has "
                          f"--cpus-per-task={cpt}: Slurm refuses CPUs outside the step and it never starts",
                          f"give each mask exactly {cpt} CPUs, or leave --cpu-bind out and let Slurm bind")
        elif any(c < cpt for c in counts):
            yield finding("cpu-bind-mask", WARNING, step.line,
                          f"--cpu-bind masks name {min(counts)} CPUs but each task has --cpus-per-task={cpt}: "
                          "the other cores sit idle",
                          f"give each mask exactly {cpt} CPUs")
