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
from typing import TYPE_CHECKING, Any

from scaletrain._version import __version__
from scaletrain.errors import ScaletrainError

if TYPE_CHECKING:  # the real signatures for type checkers and IDEs; nothing runs at import
    from scaletrain.checkpoint import Checkpointer
    from scaletrain.data.loader import loader
    from scaletrain.data.lr import scale_lr
    from scaletrain.data.metrics import all_reduce_mean, gather_objects
    from scaletrain.jobs.api import Job, submit
    from scaletrain.observe.monitor import Monitor
    from scaletrain.parallel.memory import estimate_memory
    from scaletrain.parallel.precision import accumulate, backward
    from scaletrain.parallel.setup import setup
    from scaletrain.runtime.detect import detect
    from scaletrain.runtime.env import Env
    from scaletrain.runtime.helpers import barrier, main_first, print, rank_print
    from scaletrain.runtime.init import init, shutdown
    from scaletrain.runtime.timeouts import training_started

# public name -> module that defines it
_LAZY: dict[str, str] = {
    # runtime: the per-process environment
    "Env": "scaletrain.runtime.env",
    "detect": "scaletrain.runtime.detect",
    "init": "scaletrain.runtime.init",
    "shutdown": "scaletrain.runtime.init",
    "rank_print": "scaletrain.runtime.helpers",
    "print": "scaletrain.runtime.helpers",  # the same function; rank_print does not shadow
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
    # observability
    "Monitor": "scaletrain.observe.monitor",
    # a job after planning: submit it, follow it, stop it, report on it (no torch)
    "submit": "scaletrain.jobs.api",
    "Job": "scaletrain.jobs.api",
}

# `print` stays reachable as scaletrain.print but is left out of __all__, so that
# `from scaletrain import *` does not replace the builtin print.
__all__ = ["__version__", "ScaletrainError", *(name for name in _LAZY if name != "print")]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scaletrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: the next access is a plain attribute lookup
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "print"])
