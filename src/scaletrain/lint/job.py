"""The resources a batch script asks for, read from its ``#SBATCH`` options.

Slurm lets the same request be spelt several ways (``--gres=gpu:v100:4``, ``--gpus-per-node=4``,
``--gpus-per-task=1`` with 4 tasks per node, ``--gpus=8`` over 2 nodes). ``ScriptJob`` folds them
into per-node numbers, so the rules compare like with like. ``None`` means "not stated".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from scaletrain.lint.script import BatchScript
from scaletrain.slurm.parse import parse_mem_mib, parse_time_seconds



# A count of more digits is nonsense (and int() of 4300+ digits raises): read it as this, which
# every limit rule reports as too big.
HUGE = 10**9


def _count(digits: str) -> int:
    return int(digits) if len(digits) <= 9 else HUGE


def parse_int(text: str | None) -> int | None:
    """An integer option value; ``2-4`` (a range) gives its minimum; anything else None."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9]+)(?:\s*-\s*[0-9]+)?\s*", text)
    return _count(m.group(1)) if m else None


def parse_memory_mb(text: str | None) -> float | None:
    """Slurm memory (``64G``, ``32000M``, ``500``=MB, ``0``=all of the node) in MB."""
    return parse_mem_mib(text)


def parse_time_s(text: str | None) -> int | None:
    """Slurm time in seconds; ``None`` when absent, unlimited or unreadable (lint reports, never raises)."""
    try:
        return parse_time_seconds(text)
    except ValueError:
        return None


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """A GPU request as written: which option, the type (if any) and the count."""

    option: str          # "gres" | "gpus-per-node" | "gpus-per-task" | "gpus"
    gpu_type: str | None
    count: int | None
    line: int
    text: str


def parse_gpu_value(value: str) -> tuple[str | None, int | None]:
    """``v100:4`` -> ("v100", 4); ``4`` -> (None, 4); ``a100`` -> ("a100", 1)."""
    parts = value.split(":")
    if len(parts) == 1:
        return (None, _count(parts[0])) if re.fullmatch(r"[0-9]+", parts[0]) else (parts[0] or None, 1)
    count = parse_int(parts[-1])
    return (parts[0] or None, count)


def gpu_specs(script: BatchScript) -> list[GpuSpec]:
    """Every GPU request on the #SBATCH lines (the last of each option wins)."""
    specs: list[GpuSpec] = []
    for name in ("gres", "gpus-per-node", "gpus-per-task", "gpus"):
        opt = script.option(name)
        if opt is None or opt.value is None:
            continue
        if name == "gres":
            for item in opt.value.split(","):
                kind, _, rest = item.partition(":")
                if kind != "gpu":
                    continue
                gtype, count = parse_gpu_value(rest) if rest else (None, 1)
                specs.append(GpuSpec(option=name, gpu_type=gtype, count=count, line=opt.line,
                                     text=opt.text))
        else:
            gtype, count = parse_gpu_value(opt.value)
            specs.append(GpuSpec(option=name, gpu_type=gtype, count=count, line=opt.line, text=opt.text))
    return specs


@dataclass(frozen=True, kw_only=True)
class ScriptJob:
    """Per-job and per-node numbers of a batch script (None when the script does not say)."""

    nodes: int | None
    ntasks: int | None
    ntasks_per_node: int | None
    cpus_per_task: int | None
    cpus_per_gpu: int | None
    gpus: tuple[GpuSpec, ...]
    gpus_per_node: int | None
    mem_mb: float | None
    mem_per_cpu_mb: float | None
    mem_per_gpu_mb: float | None
    time_s: int | None
    partition: str | None
    account: str | None

    @property
    def node_count(self) -> int:
        """Nodes, 1 when not stated (Slurm's default for a job that fits one node)."""
        if self.nodes is not None:
            return self.nodes
        if self.ntasks and self.ntasks_per_node:
            return max(1, math.ceil(self.ntasks / self.ntasks_per_node))
        return 1

    @property
    def tasks_per_node(self) -> int:
        """Tasks on each node (the largest share when ``--ntasks`` does not divide evenly)."""
        if self.ntasks_per_node is not None:
            return self.ntasks_per_node
        if self.ntasks is not None:
            return max(1, math.ceil(self.ntasks / self.node_count))
        return 1

    @property
    def total_tasks(self) -> int:
        """Tasks in the job."""
        if self.ntasks is not None:
            return self.ntasks
        return self.tasks_per_node * self.node_count

    @property
    def total_gpus(self) -> int | None:
        """GPUs in the job."""
        return None if self.gpus_per_node is None else self.gpus_per_node * self.node_count

    @property
    def gpu_type(self) -> str | None:
        """The GPU type named in the request, if any."""
        return next((g.gpu_type for g in self.gpus if g.gpu_type), None)


def read_request(script: BatchScript) -> ScriptJob:
    """Fold the #SBATCH options of ``script`` into a ``ScriptJob``."""
    def val(name: str) -> str | None:
        opt = script.option(name)
        return None if opt is None else opt.value

    nodes = parse_int(val("nodes"))
    ntasks = parse_int(val("ntasks"))
    ntpn = parse_int(val("ntasks-per-node"))
    specs = tuple(gpu_specs(script))
    node_count = nodes or 1
    tpn = ntpn if ntpn is not None else (math.ceil(ntasks / node_count) if ntasks else 1)
    gpn: int | None = None
    for spec in specs:
        if spec.count is None:
            continue
        if spec.option in ("gres", "gpus-per-node"):
            gpn = spec.count
        elif spec.option == "gpus-per-task":
            gpn = spec.count * tpn
        elif spec.option == "gpus" and gpn is None:
            gpn = math.ceil(spec.count / node_count)
    return ScriptJob(
        nodes=nodes, ntasks=ntasks, ntasks_per_node=ntpn,
        cpus_per_task=parse_int(val("cpus-per-task")), cpus_per_gpu=parse_int(val("cpus-per-gpu")),
        gpus=specs, gpus_per_node=gpn,
        mem_mb=parse_memory_mb(val("mem")), mem_per_cpu_mb=parse_memory_mb(val("mem-per-cpu")),
        mem_per_gpu_mb=parse_memory_mb(val("mem-per-gpu")),
        time_s=parse_time_s(val("time")), partition=val("partition"), account=val("account"))
