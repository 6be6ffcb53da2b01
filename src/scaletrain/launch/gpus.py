"""How many GPUs this launcher's workers may use, found without importing torch.

``scaletrain run --nproc-per-node auto`` needs the count before any worker starts, and the
launcher should not pay for ``import torch`` + CUDA initialisation just to count devices.
The runtime's reading of the environment (:func:`scaletrain.runtime.device.gpu_view`) decides
first, so launcher and workers agree: an explicit ``CUDA_VISIBLE_DEVICES`` (or the ROCm
equivalents), then Slurm's GPU variables. With none set, the driver's own listing
(``nvidia-smi -L``, which also sees GPUs in containers without device nodes), then the
device nodes (``/dev/nvidiaN``, AMD's KFD topology).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from scaletrain.runtime.device import gpu_view


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


def count_visible_gpus(environ: Mapping[str, str] | None = None) -> int:
    """GPUs visible to processes started from here (0 on a machine without any)."""
    env = os.environ if environ is None else environ
    view = gpu_view(env, probe=False)
    if view.from_env:
        return view.count
    smi = _nvidia_smi_count()
    if smi is not None:
        return smi
    return gpu_view(env).count
