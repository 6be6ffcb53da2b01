"""The environment report of ``scaletrain doctor``: everything a bug report needs, in one block.

Python, torch with its CUDA/ROCm/NCCL versions, the GPUs torch sees, the Slurm variables, the
visible-device variables, this process's CPU affinity, the network interfaces with their IPv4
addresses, and every NCCL_*/GLOO_*/TORCH_* setting. Reading it changes nothing.
"""

from __future__ import annotations

import os
import platform
import socket
import struct
import sys
from typing import Any, Mapping

from scaletrain._version import __version__
from scaletrain.contract.environ import CLUSTER_VAR, DEVICE_VAR

SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NTASKS",
              "SLURM_NTASKS_PER_NODE", "SLURM_CPUS_PER_TASK", "SRUN_CPUS_PER_TASK", "SLURM_GPUS",
              "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
              "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_PARTITION")
DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
               DEVICE_VAR, CLUSTER_VAR, "OMP_NUM_THREADS")
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
SETTING_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL", "TORCH_DISTRIBUTED", "FI_", "UCX_", "CXI_")


def interfaces() -> list[tuple[str, str]]:
    """(name, IPv4 address or "") for each network interface (Linux ioctl; "" elsewhere)."""
    out: list[tuple[str, str]] = []
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return out
    for name in names:
        addr = ""
        try:
            import fcntl

            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                packed = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                     struct.pack("256s", name[:15].encode()))
                addr = socket.inet_ntoa(packed[20:24])
        except (OSError, ImportError):
            pass
        out.append((name, addr))
    return out


def torch_facts() -> dict[str, Any]:
    """torch, CUDA, ROCm, cuDNN and NCCL versions and the GPUs torch sees (imports torch)."""
    facts: dict[str, Any] = {}
    try:
        import torch
    except ImportError as exc:
        return {"torch": f"not importable: {exc}"}
    facts["torch"] = torch.__version__
    facts["cuda"] = torch.version.cuda or "-"
    facts["rocm"] = getattr(torch.version, "hip", None) or "-"
    try:
        facts["cudnn"] = str(torch.backends.cudnn.version() or "-")
    except Exception:  # noqa: BLE001 - a broken CUDA install must not stop the report
        facts["cudnn"] = "-"
    facts["distributed"] = torch.distributed.is_available()
    try:
        nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
        facts["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl or "-")
    except Exception:  # noqa: BLE001
        facts["nccl"] = "-"
    gpus = []
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                gpus.append(f"cuda:{i} {p.name} {p.total_memory / 1024 ** 3:.0f} GB")
    except Exception as exc:  # noqa: BLE001
        gpus.append(f"error: {exc}")
    facts["gpus"] = gpus
    return facts


def collect(environ: Mapping[str, str] | None = None, *, with_torch: bool = True) -> dict[str, Any]:
    """The report as a dict of sections."""
    environ = os.environ if environ is None else environ
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cores = list(range(os.cpu_count() or 1))
    from scaletrain.contract.environ import format_cores

    report: dict[str, Any] = {
        "scaletrain": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu_affinity": f"{format_cores(cores)} ({len(cores)} of {os.cpu_count()} cores)",
        "slurm": {k: environ[k] for k in SLURM_VARS if k in environ},
        "devices": {k: environ[k] for k in DEVICE_VARS if k in environ},
        "launch": {k: environ[k] for k in LAUNCH_VARS if k in environ},
        "settings": {k: environ[k] for k in sorted(environ) if k.startswith(SETTING_PREFIXES)},
        "interfaces": [f"{n} {a}".strip() for n, a in interfaces()],
    }
    if with_torch:
        report.update(torch_facts())
    return report


def render(report: Mapping[str, Any]) -> str:
    """The report as text for a bug report (a fenced block pastes well)."""
    lines = ["```", f"scaletrain doctor: scaletrain {report.get('scaletrain')}"]
    for key in ("python", "platform", "host", "torch", "cuda", "rocm", "cudnn", "nccl", "cpu_affinity"):
        if key in report:
            lines.append(f"{key + ':':14}{report[key]}")
    if "gpus" in report:
        lines.append(f"{'gpus:':14}{', '.join(report['gpus']) or 'none visible to torch'}")
    lines.append(f"{'interfaces:':14}{', '.join(report['interfaces']) or '-'}")
    for section in ("slurm", "devices", "launch", "settings"):
        values = report.get(section) or {}
        body = " ".join(f"{k}={v}" for k, v in values.items()) or "(none set)"
        lines.append(f"{section + ':':14}{body}")
    lines.append("```")
    return "\n".join(lines)
