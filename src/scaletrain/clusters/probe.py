"""``scaletrain clusters probe``: write a cluster profile for the Slurm cluster we are on.

Everything a profile needs that Slurm knows comes from two texts: ``scontrol show node -o``
(CPUs, memory, GRES such as ``gpu:v100:4(S:0-1)``, which partitions each node is in) and
``scontrol show partition -o`` (MaxTime, MaxNodes, MinNodes, OverSubscribe, Default). The
parsing is a pure function, ``profile_from_scontrol``, unit-tested on captured output; only
``run_probe`` talks to Slurm (through ``scaletrain.slurm.commands``).

What Slurm does not know (GPU memory, module loads, network variables, bandwidths, whether
``--account`` is compulsory) is left empty or guessed from the GPU model, and the profile's
``sources`` and comments say so: the user edits the file and passes it with ``--profile FILE``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import shlex
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from scaletrain.clusters.schema import build_profile as profile_from_dict
from scaletrain.errors import ProfileError, SlurmError, UsageError
from scaletrain.fileio import json_text
from scaletrain.slurm.parse import (format_time, gpu_gres, parse_limit, parse_records, parse_time_seconds,
                                    slurm_release)

# Short test/debug queues: a plan uses them only when the user names them.
_TEST_NAME = re.compile(r"test|debug|dev|interactive", re.IGNORECASE)

# GPU memory by GRES type name, in GB. Slurm does not report it; these are the usual sizes of
# the models (a cluster with the 16 GB V100 or the 80 GB A100 differs: edit the profile).
_GPU_MEMORY_GB = {
    "v100": 32.0, "v100l": 32.0, "v100_32g": 32.0, "v100_16g": 16.0, "p100": 12.0, "p100l": 16.0,
    "t4": 16.0, "a40": 48.0, "a100": 40.0, "a100_40g": 40.0, "a100_80g": 80.0, "a100l": 80.0,
    "h100": 80.0, "h200": 141.0, "l40s": 48.0, "mi100": 32.0, "mi210": 64.0, "mi250": 64.0,
    "mi250x": 64.0, "mi300x": 192.0,
}


@dataclass(frozen=True, kw_only=True)
class _NodeShape:
    """The parts of a node that a profile describes; nodes with the same shape are counted together."""

    gpus: int
    gpu_type: str | None
    cpus: int
    mem_mib: int


def _node_shape(record: dict[str, str]) -> _NodeShape:
    gpus, gtype = gpu_gres(record.get("Gres"))
    cpus = parse_limit(record.get("CPUEfctv")) or parse_limit(record.get("CPUTot")) or 0
    mem = parse_limit(record.get("RealMemory")) or 0
    mem -= parse_limit(record.get("MemSpecLimit")) or 0  # memory reserved for the system
    return _NodeShape(gpus=gpus, gpu_type=gtype, cpus=cpus, mem_mib=max(mem, 0))


def _vendor(gpus: int, gpu_type: str | None) -> str:
    if gpus == 0:
        return "none"
    if gpu_type and (gpu_type.lower().startswith("mi") or "amd" in gpu_type.lower()):
        return "amd"
    return "nvidia"


def _chosen_partitions(part_records: list[dict[str, str]],
                       partitions: list[str] | None) -> list[dict[str, str]]:
    """The partitions named (UsageError for one Slurm does not know), else the visible ones."""
    known = [p["PartitionName"] for p in part_records]
    if partitions:
        unknown = [p for p in partitions if p not in known]
        if unknown:
            raise UsageError(f"unknown partition {', '.join(unknown)}",
                             f"partitions here: {', '.join(known) or 'none'}")
        part_records = [p for p in part_records if p["PartitionName"] in partitions]
    else:  # hidden partitions are not meant for users
        part_records = [p for p in part_records if p.get("Hidden", "NO") != "YES"]
    return part_records


def _partition_data(part_records: list[dict[str, str]],
                    nodes: list[dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Profile data of each chosen partition, in Slurm's order."""
    gpus_by_partition: dict[str, int] = {}
    for record in nodes:
        node_gpus = _node_shape(record).gpus
        for pname in filter(None, record.get("Partitions", "").split(",")):
            gpus_by_partition[pname] = max(gpus_by_partition.get(pname, 0), node_gpus)

    parts: dict[str, dict[str, Any]] = {}
    for record in part_records:
        pname = record["PartitionName"]
        try:
            max_seconds = parse_time_seconds(record.get("MaxTime"))
        except ValueError:
            raise SlurmError(f"scontrol gave partition {pname!r} a time limit that is not a time: "
                             f"MaxTime={record.get('MaxTime', '')[:60]!r}",
                             f"check 'scontrol show partition {shlex.quote(pname)}' with your centre; "
                             "write the profile by hand meanwhile") from None
        min_nodes = parse_limit(record.get("MinNodes"))
        part: dict[str, Any] = {
            "gpus": gpus_by_partition.get(pname, 0) > 0,
            "whole_node": record.get("OverSubscribe", "").upper().startswith("EXCLUSIVE"),
            "default": record.get("Default", "NO") == "YES",
        }
        if not part["default"] and _TEST_NAME.search(pname):
            part["test"] = True  # short test/debug queues are chosen only when named
        if (max_nodes := parse_limit(record.get("MaxNodes"))) is not None:
            part["max_nodes"] = max_nodes
        if min_nodes is not None and min_nodes > 1:
            part["min_nodes"] = min_nodes
        if max_seconds is not None:
            part["max_time"] = format_time(max_seconds)
        parts[pname] = part
    return parts


def _describe_shapes(shapes: Counter[_NodeShape], shape: _NodeShape) -> str:
    """The profile's description: the node shape it describes, then the others seen."""
    others = [f"{n} node(s) {s.gpus} GPU(s){' ' + s.gpu_type if s.gpu_type else ''} "
              f"{s.cpus} CPUs {s.mem_mib} MiB" for s, n in shapes.items() if s != shape]
    gpu_label = f"{shape.gpus} x {shape.gpu_type or 'gpu'}" if shape.gpus else "no GPUs"
    description = (f"probed from Slurm: {shapes[shape]} node(s) with {gpu_label}, "
                   f"{shape.cpus} CPUs, {shape.mem_mib} MiB")
    if others:
        description += "; also " + "; ".join(others)
    return description


def profile_from_scontrol(nodes_text: str, partitions_text: str, *, name: str,
                          site: str = "", partitions: list[str] | None = None,
                          probed_at: str = "") -> dict[str, Any]:
    """Turn ``scontrol show node -o`` and ``scontrol show partition -o`` texts into profile data.

    Returns a dict with the ``ClusterProfile`` fields (``partitions`` as ``{name: {...}}`` in
    Slurm's order). The node shape described is the most common one among GPU nodes of the
    chosen partitions (all partitions unless ``partitions`` names some); other shapes are
    listed in the description. Raises ``ProfileError`` when there are no nodes or an unknown
    partition is named.
    """
    node_records = [r for r in parse_records(nodes_text) if r.get("NodeName")]
    part_records = [r for r in parse_records(partitions_text) if r.get("PartitionName")]
    if not node_records:
        raise ProfileError("scontrol showed no nodes", "is this a Slurm cluster? try 'sinfo'")
    part_records = _chosen_partitions(part_records, partitions)
    chosen = {p["PartitionName"] for p in part_records}

    def in_chosen(record: dict[str, str]) -> bool:
        names = set(filter(None, record.get("Partitions", "").split(",")))
        return bool(names & chosen) or not part_records

    nodes = [r for r in node_records if in_chosen(r)] or node_records
    shapes = Counter(_node_shape(r) for r in nodes)
    gpu_shapes = Counter({s: n for s, n in shapes.items() if s.gpus > 0})
    pool = gpu_shapes or shapes
    # most nodes first; on a tie the bigger GPU node (it is what multi-GPU jobs are for)
    shape = max(pool, key=lambda s: (pool[s], s.gpus, s.cpus))

    parts = _partition_data(part_records, nodes)
    description = _describe_shapes(shapes, shape)
    mem_known = shape.gpu_type is not None and shape.gpu_type.lower() in _GPU_MEMORY_GB
    source = "scontrol show node -o; scontrol show partition -o"
    if probed_at:
        source += f" ({probed_at})"
    sources = [source]
    if mem_known:
        sources.append("gpu_memory_gb: usual size of the GPU model (Slurm does not report it)")
    return {
        "name": name,
        "description": description,
        "site": site or name,
        "gpus_per_node": shape.gpus,
        "gpu_model": shape.gpu_type or ("gpu" if shape.gpus else "none"),  # untyped GRES: no model
        "gpu_memory_gb": _GPU_MEMORY_GB.get((shape.gpu_type or "").lower(), 0.0),
        "gpu_vendor": _vendor(shape.gpus, shape.gpu_type),
        "cores_per_node": shape.cpus,
        # RealMemory is in MiB and sbatch's G is GiB. Not rounded: MiB / 1024 is exact in binary,
        # so a whole-node --mem gives back RealMemory; rounded up, sbatch would refuse the job.
        "mem_per_node_gb": shape.mem_mib / 1024,
        "gpu_request": "gres_typed" if shape.gpu_type else "gres",
        # --gres=gpu:N (untyped) is accepted wherever typed GRES is
        "gpu_request_accepts": ["gres_typed", "gres"] if shape.gpu_type else ["gres"],
        "gres_type": shape.gpu_type,
        "account_required": False,
        "scratch_var": None,
        "setup_lines": [],
        "container": None,
        "env": {},
        "master_addr_suffix": "",
        "gpu_cpu_map": None,
        "intra_node_gbps": None,
        "inter_node_gbps": None,
        "sources": sources,
        "notes": ["probed: check gpu_memory_gb, account_required, setup_lines, env and the "
                  "bandwidths, which Slurm does not report"],
        "partitions": parts,
    }


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json_text(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _toml_key(key: Any) -> str:
    key = str(key)
    return key if key.replace("_", "").replace("-", "").isalnum() else json_text(key)


_NOTES = {
    "gpu_memory_gb": "not reported by Slurm: from the GPU model, 0 = unknown; edit if wrong",
    "account_required": "Slurm's scontrol does not say; set true if sbatch needs --account",
    "setup_lines": "module loads or 'source' lines for the job; add yours",
}


def render_toml(profile: dict[str, Any], *, header: str = "") -> str:
    """Profile data as TOML: scalar fields first, then one ``[partitions.NAME]`` table each.

    ``None`` values are left out (TOML has no null; the loader's defaults apply).
    """
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    if lines:
        lines.append("")
    for key, value in profile.items():
        if key == "partitions" or value is None:
            continue
        if key in _NOTES:
            lines.append(f"# {_NOTES[key]}")
        lines.append(f"{key} = {_toml_value(value)}")
    for pname, part in profile.get("partitions", {}).items():
        lines.append("")
        lines.append(f"[partitions.{_toml_key(pname)}]")
        for key, value in part.items():
            if value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def run_probe(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain clusters probe [--output FILE] [--name NAME] [--partition P]``."""
    from scaletrain._version import __version__
    from scaletrain.slurm import commands

    nodes_text = commands.show_nodes_text()
    partitions_text = commands.show_partitions_text()
    cluster = commands.cluster_name() or "probed"
    name = getattr(args, "name", None) or cluster
    wanted = getattr(args, "partition", None)
    if isinstance(wanted, str):
        wanted = [p for p in wanted.split(",") if p]
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    profile = profile_from_scontrol(nodes_text, partitions_text, name=name, site=cluster,
                                    partitions=wanted or None, probed_at=when)
    # the release lint's version-dependent rules need (srun-cpus-per-task); None: left out
    profile["slurm_version"] = slurm_release(commands.version_text())
    header = (f"Cluster profile written by scaletrain {__version__} 'clusters probe' on {cluster}, {when}.\n"
              "Values come from scontrol; check the commented ones. Use: --profile THIS_FILE")
    text = render_toml(profile, header=header)
    profile_from_dict(tomllib.loads(text), path="(probed)")  # what we write must load back
    output = getattr(args, "output", None)
    if output and output != "-":
        from scaletrain.fileio import write_output

        # whole or not at all: a profile being replaced stays as it was until the new one is complete
        write_output(output, text, mode=0o644)
        print(f"scaletrain: wrote profile '{name}' to {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    print(f"scaletrain: {profile['description']}; partitions: "
          f"{', '.join(profile['partitions']) or 'none'}", file=sys.stderr)
    return 0
