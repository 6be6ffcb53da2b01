"""Lint a batch script: read it, pick the cluster, run every rule, return sorted findings.

The cluster comes from, in order: ``--profile FILE``, ``--cluster NAME``, the script itself (its
``#SBATCH --partition`` and GPU type match exactly one known profile), ``$SCALETRAIN_CLUSTER``.
When the script matches several profiles (JSC's ``booster`` is a JUWELS and a JUPITER partition),
lint checks it against each and reports the findings they all agree on, naming the candidates.
With none, only the cluster-independent rules run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Mapping

from scaletrain.checkpoint.safeio import gc_paused   # one pause of the collector, generic (no torch)
from scaletrain.contract.environ import CLUSTER_VAR
from scaletrain.contract.script import generated_for
from scaletrain.errors import UsageError
from scaletrain.fileio import read_user_file
from scaletrain.lint import rules_cluster, rules_launch, rules_program, rules_sbatch, rules_shell  # noqa: F401  (registers rules)
from scaletrain.lint.findings import ERROR, RULES, Finding, LintContext
from scaletrain.lint.job import read_request
from scaletrain.lint.script import BatchScript, interpreter, parse_script

if TYPE_CHECKING:
    from scaletrain.clusters.profile import ClusterProfile

_SHELLS = ("sh", "bash", "zsh", "ksh", "dash")
# Findings that do not judge the value on their line (it only says where they are shown)
_ABOUT_THE_CLUSTER = ("placeholder", "cluster-retired")
MAX_BYTES = 4 * 1024 * 1024   # a batch script is a few KiB; the biggest real ones ~100 KiB


@dataclass(kw_only=True)
class LintResult:
    """The findings for one file, and which cluster they were checked against."""

    path: str
    cluster: str | None
    cluster_source: str             # "--cluster", "--profile", "detected from ...", "$SCALETRAIN_CLUSTER", ""
    findings: list[Finding] = field(default_factory=list)
    candidates: tuple[str, ...] = ()  # the profiles an ambiguous script matched (cluster None)

    @property
    def errors(self) -> int:
        """Number of error findings."""
        return sum(f.severity == ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        """Number of warning findings."""
        return sum(f.severity != ERROR for f in self.findings)


def _read_bounded(path: str, hint: str) -> bytes:
    """The bytes of a regular file of at most ``MAX_BYTES``; anything else is refused
    (:func:`scaletrain.fileio.read_user_file`, the rules every user file is read by)."""
    return read_user_file(path, what="a batch script", hint=hint, limit=MAX_BYTES)


def read_script(path: str) -> str:
    """The text of a batch script; UsageError (exit 2) if it is unreadable, binary or not shell."""
    hint = "pass a Slurm batch script (a shell script with #SBATCH lines)"
    data = _read_bounded(path, hint)
    if b"\0" in data:
        raise UsageError(f"{path}: binary file, not a batch script", hint)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (not UTF-8)", hint) from None
    first = text.split("\n", 1)[0]
    if first.startswith("#!"):
        interp = interpreter(first[2:])
        if interp not in _SHELLS:
            raise UsageError(f"{path}: a '{interp or first}' script, not a shell batch script", hint)
    elif "#SBATCH" not in text:
        raise UsageError(f"{path}: no '#!' line and no #SBATCH lines: not a Slurm batch script", hint)
    if "#SBATCH" not in text and not re.search(r"\bsrun\b", text):
        # options may come from the sbatch command line, but a script with neither is not a job
        raise UsageError(f"{path}: no #SBATCH lines and no srun: not a Slurm batch script", hint)
    return text


def _profiles() -> tuple["ClusterProfile", ...]:
    from scaletrain.clusters.profile import list_profiles, load_profile
    return tuple(load_profile(name) for name in list_profiles())


@lru_cache(maxsize=1)
def _all_profiles() -> tuple["ClusterProfile", ...]:
    return _profiles()


def matching_profiles(script: BatchScript) -> tuple[list[str], str]:
    """The profiles whose partitions (and GPU type, when that tells them apart) match the
    script, and how they were found: one name, several (an ambiguous partition), or none."""
    job = read_request(script)
    if not job.partition:
        return [], ""
    profiles = _all_profiles()
    by_partition = [p for p in profiles if job.partition in p.partitions]
    if len(by_partition) == 1:
        return [by_partition[0].name], f"detected from partition '{job.partition}'"
    # a partition name several clusters share (gputest): the GPU type tells them apart
    gtype = (job.gpu_type or "").lower()
    by_type = [p for p in by_partition if gtype and (p.gres_type or "").lower() == gtype]
    if len(by_type) == 1:
        return [by_type[0].name], f"detected from partition '{job.partition}' + GPU type '{gtype}'"
    names = [p.name for p in (by_type or by_partition)]
    planned = generated_for(script.lines)
    if len(names) > 1 and planned in names:   # our own script says which it was planned for
        return [planned], f"partition '{job.partition}' + the script's scaletrain header"
    if len(names) > 1:
        return names, (f"partition '{job.partition}' matches {len(names)} profiles: only the "
                       "findings they agree on; pick one with --cluster")
    return [], ""


def detect_cluster(script: BatchScript) -> tuple[str | None, str]:
    """The one profile whose partitions (and GPU type) match the script, with how it was found."""
    names, how = matching_profiles(script)
    return (names[0], how) if len(names) == 1 else (None, "")


def choose_profile(script: BatchScript, *, cluster: str | None = None, profile_path: str | None = None,
                   env: Mapping[str, str] | None = None) -> tuple["ClusterProfile | None", str]:
    """The profile to check ``script`` against, and a few words on where it came from."""
    env = os.environ if env is None else env
    if profile_path or cluster:
        from scaletrain.clusters.profile import load_profile
        if profile_path:
            return load_profile(profile_path), "--profile"
        return load_profile(cluster), "--cluster"  # type: ignore[arg-type]
    name, how = detect_cluster(script)
    if name is None and env.get(CLUSTER_VAR):
        name, how = env[CLUSTER_VAR], f"${CLUSTER_VAR}"
    if name is None:
        return None, ""
    from scaletrain.clusters.profile import load_profile
    return load_profile(name), how


def lint_text(text: str, *, path: str = "<script>", profile: "ClusterProfile | None" = None,
              cluster_source: str = "", rules: set[str] | None = None) -> LintResult:
    """Run the rules (all, or the ids in ``rules``) on ``text``; findings sorted by line."""
    # The words, commands and steps of a long script hold no cycles, but each full pass of the
    # cyclic collector walks all of them: with it running, lint's time per line grew 1.6x from
    # 1,000 to 100,000 lines (docs/benchmarks.md); paused, it stays flat
    with gc_paused():
        script = parse_script(text, path)
        ctx = LintContext(script=script, profile=profile)
        found: list[Finding] = []
        for rule in RULES.values():
            if rules is not None and rule.id not in rules:
                continue
            if rule.needs_cluster and profile is None:
                continue
            found.extend(rule.check(ctx))
        # an #SBATCH value that is a template's blank (--partition=<partition>) is the placeholder
        # rule's to report, once: no other rule judges it as a partition or GPU type
        blanks = {n for n, _ in rules_shell.placeholder_lines(ctx) if script.lines[n - 1].startswith("#SBATCH")}
        found = [f for f in found if f.rule in _ABOUT_THE_CLUSTER or f.line not in blanks]
        unique = list(dict.fromkeys(found))
        unique.sort(key=lambda f: (f.line, f.severity != ERROR, f.rule))
        return LintResult(path=path, cluster=None if profile is None else profile.name,
                          cluster_source=cluster_source, findings=unique)


def lint_file(path: str, *, cluster: str | None = None, profile_path: str | None = None,
              env: Mapping[str, str] | None = None) -> LintResult:
    """Read, parse and lint one file (see the module docstring for how the cluster is chosen)."""
    text = read_script(path)
    script = parse_script(text, path)
    profile, how = choose_profile(script, cluster=cluster, profile_path=profile_path, env=env)
    names, ambiguous = matching_profiles(script) if profile is None else ([], "")
    if len(names) > 1:
        return lint_agreed(text, path=path, names=names, cluster_source=ambiguous)
    return lint_text(text, path=path, profile=profile, cluster_source=how)


def lint_agreed(text: str, *, path: str, names: list[str], cluster_source: str) -> LintResult:
    """Lint ``text`` against each profile in ``names``; keep the findings every one gives (a
    rule that depends on which cluster it is says nothing, the rest still speak)."""
    from scaletrain.clusters.profile import load_profile

    results = [lint_text(text, path=path, profile=load_profile(name)) for name in names]
    # a set per profile: a finding looked up in a list was a scan per finding, quadratic in a
    # script's length (a finding per srun line)
    others = [set(r.findings) for r in results[1:]]
    agreed = [f for f in results[0].findings if all(f in seen for seen in others)]
    return LintResult(path=path, cluster=None, cluster_source=cluster_source, findings=agreed,
                      candidates=tuple(names))
