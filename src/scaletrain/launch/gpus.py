"""How many GPUs this process may use, found without importing torch where possible.

``scaletrain run --nproc-per-node auto`` needs the count before any worker starts, and the
launcher should not pay for ``import torch`` + CUDA initialisation just to count devices. The
order follows what CUDA itself honours: an explicit ``CUDA_VISIBLE_DEVICES`` (or the ROCm
equivalents) first, then the driver's own listing (``nvidia-smi -L``), then device nodes.
Only on a ROCm machine with no variable set do we fall back to torch's count.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Mapping

# Checked in this order: the first one that is set decides.
VISIBLE_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def parse_visible_devices(value: str) -> int:
    """Number of devices named by a ``CUDA_VISIBLE_DEVICES``-style list.

    CUDA stops at the first invalid entry, and ``-1`` (or an empty string) hides every
    device, so ``"0,1,-1,2"`` is 2 and ``""`` is 0. UUIDs and MIG names count as one each.
    """
    count = 0
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        count += 1
    return count


def _nvidia_smi_count() -> int | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # One "GPU n: name (UUID: ...)" line per device; MIG instances are indented "MIG ..." lines.
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _device_node_count() -> int:
    return sum(1 for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p))


def count_visible_gpus(environ: Mapping[str, str] | None = None) -> int:
    """GPUs visible to processes started from here (0 on a machine without any)."""
    env = os.environ if environ is None else environ
    for name in VISIBLE_DEVICE_VARS:
        if name in env:
            return parse_visible_devices(env[name])
    smi = _nvidia_smi_count()
    if smi is not None:
        return smi
    nodes = _device_node_count()
    if nodes:
        return nodes
    if os.path.exists("/dev/kfd"):  # an AMD GPU driver; ask (ROCm) torch, lazily
        import torch

        return int(torch.cuda.device_count())
    return 0
