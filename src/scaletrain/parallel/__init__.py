"""Parallel strategies (DDP, ZeRO/FSDP2, HSDP, offload, pipeline), precision, memory estimates.

``describe(model_or_optimizer)`` says which state ``setup()`` split over ranks, how, and over
which mesh (:class:`~scaletrain.parallel.strategy.Sharding`). Importing this package does not
import torch.
"""

from scaletrain.parallel.strategy import Layout, Sharding, describe

__all__ = ["Layout", "Sharding", "describe"]
