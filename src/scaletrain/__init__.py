"""scaletrain: one PyTorch training program, from one GPU to many GPUs and Slurm nodes.

Importing this package is cheap: it never imports torch, probes GPUs or touches
``os.environ``. The public names below are resolved lazily on first use (PEP 562), so
``scaletrain.init`` imports torch only when called for.

Typical use in a training script::

    import scaletrain
    env = scaletrain.init()                      # rank, device, backend from torchrun/Slurm/MPI/none
    model, opt = scaletrain.setup(model, opt, strategy="ddp")
    loader = scaletrain.loader(dataset, global_batch_size=256)
"""

from __future__ import annotations

import importlib
from typing import Any

from scaletrain._version import __version__
from scaletrain.errors import ScaletrainError

# public name -> module that defines it
_LAZY: dict[str, str] = {
    # runtime: the per-process environment
    "Env": "scaletrain.runtime.env",
    "detect": "scaletrain.runtime.detect",
    "init": "scaletrain.runtime.init",
    "shutdown": "scaletrain.runtime.init",
    "print": "scaletrain.runtime.helpers",
    "barrier": "scaletrain.runtime.helpers",
    "main_first": "scaletrain.runtime.helpers",
    "training_started": "scaletrain.runtime.timeouts",
    # parallel strategies and precision
    "setup": "scaletrain.parallel.setup",
    "backward": "scaletrain.parallel.precision",
    "accumulate": "scaletrain.parallel.precision",
    "estimate_memory": "scaletrain.parallel.memory",
    # data
    "loader": "scaletrain.data.loader",
    "all_reduce_mean": "scaletrain.data.metrics",
    "gather_objects": "scaletrain.data.metrics",
    "scale_lr": "scaletrain.data.lr",
    # checkpoints
    "Checkpointer": "scaletrain.checkpoint",
}

__all__ = ["__version__", "ScaletrainError", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scaletrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: the next access is a plain attribute lookup
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
