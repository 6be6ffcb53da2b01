"""Findings, the rule registry, and the context every rule reads.

A rule is a function ``(LintContext) -> Iterable[Finding]`` registered under a stable id with
``@rule("id", "what it checks", needs_cluster=...)``. Ids never change meaning: users put them in
CI logs and suppressions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Iterable

from scaletrain import module_state
from scaletrain.lint.invocation import Invocation, classify
from scaletrain.lint.job import ScriptJob, parse_int, read_request
from scaletrain.lint.script import BatchScript, Command, Word
from scaletrain.lint.shell import split_commands

if TYPE_CHECKING:  # the profile module is another helper's; only its types are needed here
    from scaletrain.clusters.profile import ClusterProfile, Partition

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One problem at one line."""

    rule: str
    severity: str       # "error" | "warning"
    line: int
    message: str
    hint: str


@dataclass(frozen=True, kw_only=True)
class Rule:
    """A registered check."""

    id: str
    summary: str
    needs_cluster: bool
    check: Callable[["LintContext"], Iterable[Finding]]


RULES: dict[str, Rule] = {}
module_state.register(__name__, "RULES", reset=False)


def rule(rule_id: str, summary: str, *, needs_cluster: bool = False
         ) -> Callable[[Callable[["LintContext"], Iterable[Finding]]], Callable[["LintContext"], Iterable[Finding]]]:
    """Register a check under ``rule_id``; ``needs_cluster`` rules run only with a profile."""
    def deco(fn: Callable[["LintContext"], Iterable[Finding]]) -> Callable[["LintContext"], Iterable[Finding]]:
        if rule_id in RULES:
            raise ValueError(f"duplicate lint rule id {rule_id}")
        RULES[rule_id] = Rule(id=rule_id, summary=summary, needs_cluster=needs_cluster, check=fn)
        return fn
    return deco


@dataclass(frozen=True, kw_only=True)
class Step:
    """A command of the script as the rules see it, with a ``bash -c`` body unfolded.

    ``inner`` is set for the program found inside ``srun bash -c "..."``: the step's ``srun``
    comes from the outer command and ``via_shell`` is True.
    """

    invocation: Invocation
    srun: Invocation | None      # the srun that starts it (itself, or the outer srun of bash -c)
    line: int
    via_shell: bool = False

    @property
    def under_srun(self) -> bool:
        """Started by srun (or by mpirun, which also starts one copy per task)."""
        return self.srun is not None and (self.srun.srun is not None or self.srun.mpi is not None)


@dataclass(kw_only=True)
class LintContext:
    """The parsed script, its resource request, the cluster profile (or None), and helpers."""

    script: BatchScript
    profile: "ClusterProfile | None" = None
    findings: list[Finding] = field(default_factory=list)

    @cached_property
    def job(self) -> ScriptJob:
        """The #SBATCH request folded into per-node numbers."""
        return read_request(self.script)

    @cached_property
    def variables(self) -> dict[str, list[tuple[Word, Command]]]:
        """Assignments in the script, by variable name."""
        return self.script.assignments()

    def literal(self, name: str) -> str | None:
        """The value of ``$name`` when the script assigns it exactly one literal value."""
        entries = self.variables.get(name, [])
        if len(entries) != 1:
            return None
        word = entries[0][0]
        return None if word.expansions or "$(" in word.raw or "`" in word.raw else word.value

    def resolve_int(self, text: str | None) -> int | None:
        """A number from an option value: ``4``, ``$N`` with ``N=4``, or a Slurm variable of the job."""
        if text is None:
            return None
        text = text.strip()
        if text.isdigit():
            return parse_int(text)     # ASCII digits only, bounded (an int of 5000 digits raises)
        name = text.lstrip("$").strip("{}")
        if name in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
            return self.job.node_count
        if name in ("SLURM_NTASKS", "SLURM_NPROCS"):
            return self.job.total_tasks
        if name in ("SLURM_NTASKS_PER_NODE",):
            return self.job.tasks_per_node
        if name in ("SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE"):
            return self.job.gpus_per_node
        if text.startswith("$"):
            lit = self.literal(name)
            return parse_int(lit) if lit is not None else None
        return None

    @cached_property
    def steps(self) -> list[Step]:
        """Every command, classified; ``srun bash -c BODY`` also yields the commands of BODY."""
        out: list[Step] = []
        for cmd in self.script.commands:
            inv = classify(cmd)
            out.append(Step(invocation=inv, srun=inv if (inv.srun or inv.mpi) else None, line=cmd.line))
            if inv.kind == "shell" and inv.shell_body is not None:
                for inner_cmd in self.shell_body_commands(inv.shell_body):
                    inner = classify(inner_cmd)
                    out.append(Step(invocation=inner, srun=inv if (inv.srun or inv.mpi) else None,
                                    line=inner_cmd.line, via_shell=True))
        return out

    def shell_body_commands(self, body: Word) -> list[Command]:
        """Commands of a ``bash -c`` body; a body that is just ``$VAR`` reads VAR's assignment."""
        text = body.value.strip()
        line = body.line
        name = text.lstrip("$").strip("{}")
        if text.startswith("$") and name.isidentifier():
            entries = self.variables.get(name, [])
            if entries:
                word, cmd = entries[-1]
                text, line = word.value, word.line
        return split_commands(text, first_line=line, heredoc_quote="bare")

    @cached_property
    def partition(self) -> "Partition | None":
        """The profile's entry for the partition asked for, or the one Slurm routes to without one.

        Without ``--partition`` only an ``implicit`` partition (Alliance clusters route jobs
        themselves) is assumed: a profile's ``default`` is the planner's choice, not Slurm's.
        """
        if self.profile is None:
            return None
        if self.job.partition is None:
            return next((p for p in self.profile.partitions.values()
                         if p.default and getattr(p, "implicit", False)), None)
        return self.profile.partitions.get(self.job.partition)

    @property
    def partition_known(self) -> bool:
        """False when the script names a partition the profile does not list."""
        return self.job.partition is None or self.partition is not None

    @property
    def cpus_per_node(self) -> int:
        """CPUs the request takes on each node."""
        job = self.job
        if job.cpus_per_gpu and job.gpus_per_node:
            return job.cpus_per_gpu * job.gpus_per_node
        return (job.cpus_per_task or 1) * job.tasks_per_node

    @property
    def whole_nodes(self) -> bool:
        """True when no other job can share the job's nodes: ``--exclusive``, a partition that
        allocates whole nodes, or every GPU and core of the cluster's nodes asked for."""
        if self.script.option("exclusive") is not None:
            return True
        prof, part = self.profile, self.partition
        if prof is None:
            return False
        if part is not None and part.whole_node:
            return True
        gpn = self.job.gpus_per_node
        return bool(prof.gpus_per_node and gpn and gpn >= prof.gpus_per_node
                    and prof.cores_per_node and self.cpus_per_node >= prof.cores_per_node)

    @property
    def shares_nodes(self) -> bool:
        """True when lint knows other jobs can run on the job's nodes: the profile names the
        partition (or the one Slurm routes to) and it hands out parts of nodes. Without a profile,
        or on a partition it does not list (JSC's whole-node ``dc-gpu``), lint cannot tell."""
        part = self.partition
        return self.profile is not None and part is not None and not part.whole_node

    def option_line(self, *names: str) -> int:
        """Line of the first of ``names`` given on a #SBATCH line (1 when none is)."""
        for name in names:
            opt = self.script.option(name)
            if opt is not None:
                return opt.line
        return 1


def finding(rule_id: str, severity: str, line: int, message: str, hint: str) -> Finding:
    """Shorthand used by the rule modules."""
    return Finding(rule=rule_id, severity=severity, line=line, message=message, hint=hint)
