"""``scaletrain clusters check``: compare a shipped profile with what Slurm reports on the login node.

Centres change partitions, time limits and GRES names; a profile written from their pages goes
stale quietly. ``check`` reads the same two texts as ``clusters probe`` (``scontrol show node -o``
and ``scontrol show partition -o``), builds the probed description with the probe's pure parser
(``profile_from_scontrol``) and lists every difference that changes a plan: a partition missing on
either side, its time limit, node limit or whole-node allocation, the GPUs per node, the GRES
type and the cores per node; and the Slurm release (``sinfo --version``), which lint's
version-dependent rules read from the profile's ``slurm_version``. ``compare`` is pure; only
``run_check`` talks to Slurm.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from scaletrain.clusters.probe import profile_from_scontrol
from scaletrain.clusters.profile import ClusterProfile, parse_time
from scaletrain.slurm.parse import parse_version, slurm_release
from scaletrain.errors import UsageError


@dataclass(frozen=True)
class Difference:
    """One fact the profile states differently from Slurm (``profile`` / ``slurm`` as text)."""

    what: str
    profile: str
    slurm: str

    def line(self) -> str:
        """``what: profile says X, Slurm says Y`` for the report."""
        return f"{self.what}: profile says {self.profile}, Slurm says {self.slurm}"


def _time(value: str | None) -> int | None:
    return parse_time(value) if value else None


def _show(value: Any) -> str:
    return "none" if value is None or value == "" else str(value)


def compare(profile: ClusterProfile, nodes_text: str, partitions_text: str,
            version_text: str = "") -> list[Difference]:
    """Every plan-relevant difference between ``profile`` and the scontrol texts (and, when given,
    ``sinfo --version``), in a fixed order."""
    slurm = profile_from_scontrol(nodes_text, partitions_text, name=profile.name)
    sparts: dict[str, dict[str, Any]] = slurm["partitions"]
    out: list[Difference] = []
    ours, theirs = parse_version(profile.slurm_version), parse_version(version_text)
    if ours is not None and theirs is not None and ours[:2] != theirs[:2]:   # lint's rules go by release
        out.append(Difference("Slurm release", str(profile.slurm_version), str(slurm_release(version_text))))
    if slurm["gpus_per_node"] != profile.gpus_per_node:
        out.append(Difference("GPUs per node", str(profile.gpus_per_node), str(slurm["gpus_per_node"])))
    typed = profile.gpu_request in ("gres_typed", "gpus_per_node_typed")
    if typed and (slurm["gres_type"] or "") != (profile.gres_type or ""):
        out.append(Difference("GRES type", _show(profile.gres_type), _show(slurm["gres_type"])))
    if profile.gpus_per_node and slurm["cores_per_node"] and slurm["cores_per_node"] != profile.cores_per_node:
        out.append(Difference("CPU cores per GPU node", str(profile.cores_per_node), str(slurm["cores_per_node"])))
    for name, part in profile.partitions.items():
        if part.implicit:
            continue   # routed by Slurm: no partition of that name to compare with
        if name not in sparts:
            out.append(Difference(f"partition {name}", "it exists", "no such partition"))
            continue
        s = sparts[name]
        if _time(part.max_time) != _time(s.get("max_time")):
            out.append(Difference(f"partition {name} time limit", _show(part.max_time), _show(s.get("max_time"))))
        if s.get("max_nodes") is not None and part.max_nodes != s.get("max_nodes"):
            out.append(Difference(f"partition {name} node limit", _show(part.max_nodes), str(s["max_nodes"])))
        if (part.min_nodes or 1) != (s.get("min_nodes") or 1):   # the probe leaves out Slurm's default of 1
            out.append(Difference(f"partition {name} minimum nodes", str(part.min_nodes or 1),
                                  str(s.get("min_nodes") or 1)))
        if part.whole_node != bool(s.get("whole_node")):
            out.append(Difference(f"partition {name} whole nodes", str(part.whole_node).lower(),
                                  str(bool(s.get("whole_node"))).lower()))
    for name, s in sparts.items():
        if s.get("gpus") and name not in profile.partitions:
            out.append(Difference(f"partition {name}", "not listed", "a GPU partition"))
    return out


def render_report(profile: ClusterProfile, diffs: list[Difference], version_text: str = "") -> str:
    """The text ``clusters check`` prints: one line per difference, the Slurm release where the
    profile records none (to be written into it), then a verdict."""
    lines = [f"scaletrain clusters check: profile {profile.name} ({profile.path or 'inline'})"]
    lines += [f"  differs: {d.line()}" for d in diffs]
    release = slurm_release(version_text)
    if release and not profile.slurm_version:
        lines.append(f"  Slurm {release} here; the profile records no release: add slurm_version = \"{release}\" "
                     "to your copy (~/.config/scaletrain/clusters/) so lint applies the rules of that release")
    if diffs:
        lines.append(f"  {len(diffs)} difference{'s' if len(diffs) != 1 else ''}: correct the profile (copy it to "
                     "~/.config/scaletrain/clusters/ and edit it), or tell scaletrain's maintainers")
    else:
        lines.append("  the profile matches Slurm (partitions, time and node limits, GRES, GPUs and cores per node)")
    return "\n".join(lines)


def run_check(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain clusters check [NAME]``: exit 0 when all match, 1 when something differs."""
    from scaletrain.clusters.profile import list_profiles, load_profile
    from scaletrain.slurm import commands

    name = getattr(args, "target", None)
    if not name:
        here = commands.cluster_name()
        if not here or here.lower() not in list_profiles():
            raise UsageError(f"which profile? Slurm's cluster name is {here or 'unknown'!r}, not a profile name",
                             "name it: scaletrain clusters check roihu")
        name = here.lower()
    profile = load_profile(name)
    version = commands.version_text()
    diffs = compare(profile, commands.show_nodes_text(), commands.show_partitions_text(), version)
    print(render_report(profile, diffs, version), file=sys.stdout)
    return 1 if diffs else 0
