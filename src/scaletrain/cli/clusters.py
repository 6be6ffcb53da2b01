"""``scaletrain clusters``: list the known cluster profiles, show one, probe or check this cluster.

    scaletrain clusters                  # table of every profile
    scaletrain clusters lumi             # one profile in full (also: clusters show lumi)
    scaletrain clusters probe -o my.toml # build a profile from sinfo/scontrol (inside Slurm)
    scaletrain clusters check roihu      # compare the roihu profile with this cluster's Slurm

``probe`` and ``check`` live in ``scaletrain.clusters.probe`` / ``.check``, imported only when used.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from scaletrain.contract.environ import CLUSTERS_DIR_VAR
from scaletrain.errors import UsageError
from scaletrain.fileio import json_text

if TYPE_CHECKING:
    from scaletrain.clusters.profile import Partition

DESCRIPTION = f"""\
List the cluster profiles scaletrain knows (shipped, plus your own in ${CLUSTERS_DIR_VAR}
or ~/.config/scaletrain/clusters), show one in full, or probe the Slurm cluster you are on
and write a profile for it."""

EPILOG = """\
examples:
  scaletrain clusters
  scaletrain clusters roihu
  scaletrain clusters lumi --json
  scaletrain clusters probe --output ~/.config/scaletrain/clusters/mycluster.toml --name mycluster
  scaletrain clusters probe --partition gpu,gputest     # only these partitions
  scaletrain clusters check roihu      # on a Roihu login node: what differs from Slurm
"""


def _short_site(site: str, width: int = 38) -> str:
    """The site for the table: whole words up to ``width`` characters, then "..." (never a cut word)."""
    if len(site) <= width:
        return site
    cut = site[: width - 3]
    if site[width - 3] not in " ,;":   # the cut falls inside a word: drop that word
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;(-/") + "..."


def _list(as_json: bool) -> int:
    from scaletrain.clusters.profile import list_profiles, load_profile

    profiles = [load_profile(n) for n in list_profiles()]
    if as_json:
        print(json_text([{"name": p.name, "site": p.site, "gpus_per_node": p.gpus_per_node,
                           "gpu_model": p.gpu_model, "partitions": list(p.partitions),
                           "retired": p.retired, "successor": p.successor,
                           "path": p.path} for p in profiles], indent=2))
        return 0
    rows = [("NAME", "SITE", "GPUS/NODE", "GPU", "PARTITIONS")]
    for p in profiles:
        parts = ", ".join(n for n, part in p.partitions.items() if not part.implicit) or (
            "(routed by Slurm)" if p.scheduler == "slurm" else "(no Slurm)")
        model = f"{p.gpu_model} {p.gpu_memory_gb:g}GB" if p.gpus_per_node else "none (CPU)"
        if p.retired:
            parts = f"RETIRED {p.retired}, successor: {p.successor or '-'}"
        rows.append((p.name, _short_site(p.site), str(p.gpus_per_node) if p.gpus_per_node else "-", model, parts))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4])
    return 0


def _show(name: str, as_json: bool) -> int:
    from scaletrain.clusters.profile import load_profile, profile_to_dict

    p = load_profile(name)
    if as_json:
        print(json_text(profile_to_dict(p), indent=2))
        return 0
    gpus = (f"{p.gpus_per_node} x {p.gpu_model} ({p.gpu_memory_gb:g} GB, {p.gpu_vendor})"
            if p.gpus_per_node else "none: CPU worker processes")
    request = {"gres_typed": f"--gres=gpu:{p.gres_type}:N", "gres": "--gres=gpu:N",
               "gpus_per_node": "--gpus-per-node=N", "gpus_per_task": "--gpus-per-task=N",
               "gpus_per_node_typed": f"--gpus-per-node={p.gres_type}:N"}[p.gpu_request]
    lines = [
        f"{p.name}: {p.description}",
        f"  site:            {p.site}",
        f"  GPUs per node:   {gpus}",
        f"  CPU cores/node:  {p.cores_per_node} usable ({p.cores_per_gpu} per GPU)",
        f"  memory/node:     {p.mem_per_node_gb:g} GB requestable; jobs ask: {p.mem_request}"
        + (f" ({p.mem_per_gpu:g} GB per GPU)" if p.mem_request == "proportional" else ""),
        f"  scheduler:       {p.scheduler}" + (f"; GPU request {request}" if p.scheduler == "slurm" else ""),
        f"  account:         {'required (--account)' if p.account_required else 'optional'}",
        f"  node scratch:    {p.scratch_var or 'none'}"
        + (f" (ask --gres={p.scratch_gres}:GB, up to {p.scratch_max_gb:g})" if p.scratch_gres else
           f" ({p.scratch_max_gb:g} GiB per user)" if p.scratch_max_gb else "")
        + (" (a RAM disk: it takes the job's memory)" if p.scratch_in_memory else ""),
        "  MASTER_ADDR:     first node's host name" + (f" + '{p.master_addr_suffix}'" if p.master_addr_suffix else ""),
        f"  bandwidth:       intra-node {p.intra_node_gbps or '?'} Gbit/s per GPU, "
        f"inter-node {p.inter_node_gbps or '?'} Gbit/s per node",
        "  partitions:",
    ]
    lines += [_partition_line(part) for part in p.partitions.values()]
    if p.setup_lines:
        lines.append("  set-up:")
        lines += [f"    {s}" for s in p.setup_lines]
    if p.env:
        lines.append("  environment:     " + " ".join(f"{k}={v}" for k, v in p.env.items()))
    if p.gpu_cpu_map:
        lines.append("  GPU -> cores:    " + "; ".join(
            f"{g}: {c[0]}-{c[-1]}" for g, c in sorted(p.gpu_cpu_map.items())))
    for note in p.notes:
        lines.append(f"  note: {note}")
    if p.retired:
        lines.append(f"  RETIRED:         {p.retired}; successor: {p.successor or '-'} "
                     f"(port scripts: scaletrain port OLD.sh --cluster {p.successor or 'NAME'})")
    lines.append("  sources" + (f" (checked {p.checked})" if p.checked else "") + ":")
    lines += [f"    {s}" for s in p.sources]
    if p.facts:
        lines.append("  facts and where they come from:")
        lines += [f"    {k}: {v}" for k, v in p.facts.items()]
    if p.unconfirmed:
        lines.append("  unconfirmed (no current document states these; check them on the cluster):")
        lines += [f"    {k}: {v}" for k, v in p.unconfirmed_facts.items()]
    lines.append(f"  file: {p.path}")
    print("\n".join(lines))
    return 0


def _partition_line(part: Partition) -> str:
    """One partition of ``clusters NAME``: its limits, its flags, its description."""
    limits = []
    if part.min_gpus is not None:
        limits.append(f"min {part.min_gpus} GPUs")
    if part.max_gpus is not None:
        limits.append(f"max {part.max_gpus} GPUs")
    if part.max_nodes is not None:
        limits.append(f"max {part.max_nodes} nodes")
    if part.max_nodes_no_allocation is not None:
        limits.append(f"{part.max_nodes_no_allocation} without an allocation")
    if part.cores_per_node is not None:
        limits.append(f"{part.cores_per_node} cores/node")
    if part.max_time:
        limits.append(f"max {part.max_time}")
    flags = [f for f, on in (("default", part.default), ("whole nodes", part.whole_node),
                             ("test", part.test), ("no --partition line", part.implicit)) if on]
    return (f"    {part.name:<12} {', '.join(limits + flags)}"
            + (f" - {part.description}" if part.description else "")
            + (f"; access: {part.access}" if part.access else ""))


def run_clusters(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain clusters [NAME | probe ...]``."""
    probe_flags = [f for f, v in (("--output", args.output), ("--name", args.name),
                                  ("--partition", args.partition)) if v]
    if args.cluster == "probe":
        from scaletrain.clusters.probe import run_probe

        return int(run_probe(args) or 0)
    if args.cluster == "check":
        from scaletrain.clusters.check import run_check

        return run_check(args)
    if args.cluster == "show" and args.target:   # 'clusters show NAME' reads as 'clusters NAME'
        return _show(args.target, args.json)
    if getattr(args, "target", None):
        raise UsageError(f"unexpected {args.target!r} after {args.cluster!r}",
                         "a second name goes only with 'check': scaletrain clusters check NAME")
    if probe_flags:
        raise UsageError(f"{', '.join(probe_flags)} only go with 'probe'",
                         "scaletrain clusters probe --output FILE [--name NAME] [--partition P]")
    if args.cluster:
        return _show(args.cluster, args.json)
    return _list(args.json)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``clusters`` verb (with ``probe``)."""
    p = subparsers.add_parser("clusters", help="list/show cluster profiles, or probe this Slurm cluster",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cluster", nargs="?", metavar="NAME|probe|check",
                   help="a profile to show, 'probe' to build one from this cluster's Slurm, or 'check' "
                        "to compare a profile with it")
    p.add_argument("target", nargs="?", metavar="NAME",
                   help="check: the profile to compare (default: the one named like Slurm's cluster)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    g = p.add_argument_group("probe")
    g.add_argument("--output", "-o", metavar="FILE", help="probe: write the profile here (default stdout)")
    g.add_argument("--name", metavar="NAME", help="probe: profile name (default: Slurm's ClusterName)")
    g.add_argument("--partition", metavar="P", help="probe: only these partitions (comma-separated)")
    p.set_defaults(func=run_clusters)
