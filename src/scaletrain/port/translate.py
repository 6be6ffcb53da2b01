"""An old job on a new cluster: ``port(old, target, source) -> Ported`` (a plan and what changed).

The request keeps what belongs to the job (GPUs, nodes, time, account, the launcher, the program
and its arguments word for word, exports and set-up commands) and leaves to the planner what
belongs to the cluster (GPU type and syntax, partition, CPUs and memory per GPU, modules or
container). The translated request and the target profile enter the planner's first stage as
any request does (``make_plan``: settle, resources, software, files), without what this machine
would measure: the job is planned for another cluster. Every difference is listed, and so is
everything that could not be carried. Pure: no I/O (the CLI reads the file and prints).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass

from scaletrain.clusters.profile import ClusterProfile, format_time, parse_time
from scaletrain.errors import PlanError, ProfileError, UsageError
from scaletrain.plan.planner import make_plan
from scaletrain.plan.records import Plan
from scaletrain.plan.render import sbatch_options, setup_lines
from scaletrain.plan.request import JobRequest, format_mem
from scaletrain.port.recover import OldJob

# Launchers whose own count flags (--nproc_per_node, --num_processes...) the new line recomputes.
_COUNTED = {"torchrun": "--nproc_per_node/--nnodes", "accelerate": "--num_processes/--num_machines",
            "deepspeed": "--num_gpus/--num_nodes"}


_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, kw_only=True)
class Ported:
    """The new plan, the changes made, and what the old script had that the new one lacks."""

    plan: Plan
    changes: tuple[str, ...]
    lost: tuple[str, ...]


def _size(old: OldJob, target: ClusterProfile) -> tuple[int | None, int | None, int | None]:
    """(gpus, nodes, gpus_per_node) for the planner: the old per-node layout where the target's
    nodes hold it, else the total."""
    gpn = old.gpus_per_node or 1
    per_node = target.gpus_per_node or gpn
    if old.nodes > 1 and gpn <= per_node:
        return None, old.nodes, gpn
    return gpn * old.nodes, None, None


def _gpus_per_proc(old: OldJob, target: ClusterProfile) -> int:
    """One old process driving G GPUs keeps G where the target's nodes hold them (else a node's worth)."""
    if old.gpus_per_proc <= 1:
        return 1
    g = min(old.gpus_per_proc, target.gpus_per_node or old.gpus_per_proc)
    total = old.gpus_per_node * old.nodes
    while total % g:
        g -= 1
    return max(1, g)


def _longest(target: ClusterProfile) -> int | None:
    """The longest time limit of the target's production GPU partitions (None: one has no limit)."""
    limits = [p.max_seconds for p in target.partitions.values() if not p.test and (p.gpus or p.implicit)]
    return None if not limits or None in limits else max(x for x in limits if x is not None)


def _test_partition(target: ClusterProfile) -> str | None:
    return next((p.name for p in target.partitions.values() if p.test and p.gpus), None)


def request_for(old: OldJob, target: ClusterProfile, source: ClusterProfile | None, *,
                script_path: str, account: str | None = None,
                venv: str | None = None) -> tuple[JobRequest, list[str]]:
    """The JobRequest on ``target`` for ``old``, and the set-up lines added on the way (with why)."""
    added: list[str] = []
    setup = [ln.text for ln in old.setup]
    old_scratch = (source.scratch_var or "").lstrip("$") if source else ""
    new_scratch = target.scratch_var or ""
    if (_VAR.fullmatch(old_scratch) and new_scratch and new_scratch != f"${old_scratch}"
            and _uses(old, old_scratch)):
        # the arguments and set-up keep their words: the old name points at the new disk
        value = f'"{new_scratch}"' if _VAR.fullmatch(new_scratch.lstrip("$")) else shlex.quote(new_scratch)
        alias = f"export {old_scratch}={value}"
        setup.insert(0, alias)
        added.append(f"node-local disk: ${old_scratch} is {new_scratch} on {target.name} (added: {alias})")
    sb = old.sbatch
    gpus, nodes, gpn = _size(old, target)
    req = JobRequest(
        gpus=gpus, nodes=nodes, gpus_per_node=gpn,
        cluster=target.name, script=old.script, script_args=old.args, launcher=old.launcher,
        time=sb.get("time"), account=account or sb.get("account"), job_name=sb.get("job-name"),
        mail_type=sb.get("mail-type"), mail_user=sb.get("mail-user"), array=sb.get("array"),
        dependency=sb.get("dependency"), log=sb.get("output"), error_log=sb.get("error"),
        chdir=sb.get("chdir"), exclusive="exclusive" in sb,
        gpus_per_proc=_gpus_per_proc(old, target), expand_args=old.expand_args,
        accelerate_config=old.accelerate_config, env=tuple(old.env), setup=tuple(setup),
        venv=venv, wheels=() if venv else old.wheels,
        command=("scaletrain", "port", script_path, "--cluster", target.name))
    return req, added


def _uses(old: OldJob, var: str) -> bool:
    pattern = (f"${var}", f"${{{var}}}")
    return var in old.used_vars or any(p in ln.text for ln in old.setup for p in pattern)


def port(old: OldJob, target: ClusterProfile, source: ClusterProfile | None, *, script_path: str,
         account: str | None = None, venv: str | None = None) -> Ported:
    """Plan ``old`` on ``target`` and list every change (PlanError when the target cannot run it;
    UsageError when the old script's venv cannot be carried and no ``venv`` replaces it)."""
    req, added = request_for(old, target, source, script_path=script_path, account=account, venv=venv)
    longest = _longest(target)
    asked = _seconds(req.time)
    if longest and asked and asked > longest:
        req = dataclasses.replace(req, time=format_time(longest))
        added.append(f"time: {old.sbatch['time']} is more than any {target.name} partition allows; "
                     f"{format_time(longest)} instead (checkpoint and resume: plan --requeue, docs/long-jobs.md)")
    test_wanted = bool(source and old.partition in source.partitions and source.partitions[old.partition].test)
    plan = None
    test_part = _test_partition(target) if test_wanted else None
    if test_part:
        try:
            plan = make_plan(dataclasses.replace(req, partition=test_part), target)
        except (PlanError, UsageError):
            plan = None     # too big or too long for the test queue: production, listed below
    if plan is None:
        plan = make_plan(req, target)
    added += _venv_packages(old, plan, script_path)
    changes = added + _changes(old, plan, source, test_wanted)
    return Ported(plan=plan, changes=tuple(changes), lost=tuple(_lost(old, plan)))


def check_ported(script: str, plan: Plan) -> None:
    """Lint the new script as ``scaletrain lint`` would; UsageError on its first error (nothing is written).

    The carried lines are the old script's words: a here-document or a quote that does not fit
    where the new script puts them must stop the port, not reach the queue.
    """
    from scaletrain.lint.engine import lint_text
    from scaletrain.lint.findings import ERROR

    errors = [f for f in lint_text(script, path="<ported script>", profile=plan.settled.profile).findings
              if f.severity == ERROR]
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise UsageError(f"the ported script would fail lint at its line {first.line}: {first.message}{more}",
                         f"{first.hint}; change that line of the old script (or drop it) and port again")


def _per_gpu(value: float | None, old: OldJob) -> float | None:
    gpus = max(1, old.gpus_per_node)
    return None if value is None else value / gpus


def _venv_packages(old: OldJob, plan: Plan, script_path: str) -> list[str]:
    """The packages the old script's venv installed, in the new job's environment: installed by
    the job's own venv, or the user's ``--venv`` told to have them; else port stops."""
    new, venv = plan.settled.profile, plan.settled.request.venv
    fix = (f"make an environment on {new.name} ('scaletrain env create --cluster {new.name} DIR', then "
           "DIR/bin/pip install what the old script installed) and port with --venv DIR")
    if old.env_problem and not venv:
        ln = old.env_problem
        raise UsageError(f"{script_path}:{ln.line}: the old script builds its Python environment with a step "
                         f"port cannot carry: {ln.why}", fix)
    extra = [w for w in old.wheels if w.split("[")[0].split("==")[0].lower() != "torch"]
    if not extra:
        return []
    if venv:
        return [f"software: --venv {venv} replaces the venv the old script built; it must have "
                f"{' '.join(old.wheels)}"]
    if not plan.software.builds_venv:
        raise UsageError(f"{script_path}: the old script's venv installs {' '.join(extra)}, and a {new.name} job "
                         f"does not build a venv of its own ({plan.software.description})", fix)
    return [f"software: the old script's venv packages ({' '.join(old.wheels)}) are installed by the new job's "
            f"venv ({plan.software.wheels})"]


def _changes(old: OldJob, plan: Plan, source: ClusterProfile | None, test_wanted: bool) -> list[str]:
    out: list[str] = []
    src = source.name if source else "the old cluster"
    old_type = old.gpu_type or (source.gpu_model if source else "?")
    new, res, request = plan.settled.profile, plan.resources, plan.settled.request
    out.append(f"GPUs: {old.nodes} node(s) x {old.gpus_per_node} {old_type} -> {res.nodes} node(s) x "
               f"{res.gpus_per_node} {new.gpu_model} ({res.gpus} in all, {res.world_size} processes)")
    if old.gpus_per_proc > 1 and request.gpus_per_proc != old.gpus_per_proc:
        out.append(f"GPUs per process: {old.gpus_per_proc} -> {request.gpus_per_proc} (a {new.name} node "
                   f"has {new.gpus_per_node})")
    gpu_line = next((f"--{k}={v}" for k, v in sbatch_options(plan) if k in ("gres", "gpus-per-node", "gpus")), "")
    if gpu_line:
        out.append(f"GPU request: {gpu_line}")
    part = res.partition or "(routed by Slurm)"
    intent = "test" if test_wanted else "production"
    note = ""
    if test_wanted and not (res.partition and new.partitions[res.partition].test):
        note = f" (the test queue of {new.name} does not take this job; production instead)"
    out.append(f"partition: {old.partition or '(none)'} -> {part} ({intent}{note})")
    cpus_old = (old.cpus_per_task or 0) * old.tasks_per_node
    if old.gpus_per_node:
        cpg_old = f"{cpus_old / old.gpus_per_node:g}" if cpus_old else "?"
        cpg_new = res.cpus_per_task * res.tasks_per_node / max(1, res.gpus_per_node)
        if cpg_old != f"{cpg_new:g}":
            out.append(f"CPU cores per GPU: {cpg_old} -> {cpg_new:g}")
    mem_old = _per_gpu(old.mem_mb, old)
    mem_new = res.mem_per_proc_gb * res.procs_per_node / max(1, res.gpus_per_node) \
        if res.mem_per_proc_gb else None
    old_txt = ("the whole node" if old.mem_mb == 0 else format_mem(mem_old / 1024)) if mem_old is not None else \
        "(not stated)"
    new_txt = format_mem(mem_new) if mem_new else ("the whole node" if res.mem == "0" else "(Slurm's default)")
    if old_txt != new_txt:
        out.append(f"memory per GPU: {old_txt} -> {new_txt}")
    if "time" not in old.sbatch:
        out.append(f"time: (not stated) -> {res.time}")
    elif _seconds(old.sbatch["time"]) != res.time_seconds:
        out.append(f"time: {old.sbatch['time']} -> {res.time}")
    out += _software(old, plan, src)
    out += _staging(old, plan, source)
    if old.launcher in _COUNTED:
        out.append(f"launch: {old.launcher} kept; its {_COUNTED[old.launcher]} follow the new layout")
    else:
        out.append(f"launch: srun, {res.tasks_per_node} task(s) per node (launcher {request.launcher}: RANK, "
                   "LOCAL_RANK, WORLD_SIZE also set)")
    out += [f"line {ln.line}: {_first(ln.text)} -> {ln.why}" for ln in old.replaced]
    out += [f"line {ln.line}: carried with --setup: {_first(ln.text)}" for ln in old.setup]
    out += [f"exported with --env: {k}={v}" for k, v in old.env]
    return out


def _staging(old: OldJob, plan: Plan, source: ClusterProfile | None) -> list[str]:
    """Where the carried staging lines now write, and whether the old disk request still fits."""
    new = plan.settled.profile
    old_var = source.scratch_var if source else None
    staged = [ln for ln in old.setup if old_var and (old_var in ln.text or old_var.replace("$", "${", 1) in ln.text)]
    if not staged and old.disk_gb is None:
        return []
    where = new.scratch_var or "(no node-local disk)"
    facts = [f"at most {new.scratch_max_gb:g} GB" if new.scratch_max_gb else "",
             "in memory: it counts against --mem" if new.scratch_in_memory else "",
             f"asked with --gres={new.scratch_gres}:GB" if new.scratch_gres else "no request needed"]
    out = [f"data staging: line {ln.line} carried as written" for ln in staged]
    out.append(f"node-local disk: {where} on {new.name} ({', '.join(f for f in facts if f)})")
    if old.disk_gb and new.scratch_max_gb and old.disk_gb > new.scratch_max_gb:
        out.append(f"node-local disk: the old script asked {old.disk_gb:g} GB; {new.name} allows "
                   f"{new.scratch_max_gb:g} GB: stage less, or read from the shared file system")
    return out


def _seconds(text: str | None) -> int | None:
    try:
        return parse_time(text) if text else None
    except ProfileError:
        return None


def _software(old: OldJob, plan: Plan, src: str) -> list[str]:
    was = "; ".join(ln.text for ln in old.modules) or "(none)"
    sw = plan.software
    if sw.container:
        now = f"container {sw.container.strip()}"
    else:
        now = "; ".join(ln for ln in setup_lines(plan) if ln not in plan.settled.request.setup) or "(none)"
    return [f"software: {was} -> {now}"]


def _first(text: str) -> str:
    first = text.splitlines()[0] if text else ""
    return first + (" ..." if "\n" in text else "")


def _lost(old: OldJob, plan: Plan) -> list[str]:
    out = [f"line {ln.line}: {_first(ln.text)} ({ln.why})" for ln in old.lost]
    res = plan.resources
    if old.container and not plan.software.container:
        out.append(f"the container image {old.container} (pass --container IMAGE if it runs on "
                   f"{plan.settled.profile.name})")
    if old.gpus_per_node and res.gpus != old.gpus_per_node * old.nodes:
        out.append(f"the GPU count: {old.gpus_per_node * old.nodes} asked, {res.gpus} planned")
    if res.world_size != old.tasks_per_node * old.nodes and old.launcher == "srun":
        out.append(f"the process count: {old.tasks_per_node * old.nodes} -> {res.world_size} (the program must "
                   "read its world size, not assume it)")
    return out
