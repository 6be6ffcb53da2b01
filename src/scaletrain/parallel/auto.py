"""The ``auto`` strategy: the cheapest strategy whose model state fits in device memory.

Tried in order ``ddp``, ``zero2``, ``zero3``, ``offload`` (least communication first). A
strategy fits when ``estimate_memory(...).total`` - parameters, gradients and optimizer state
per rank, the ZeRO accounting - is at most ``fraction`` (default 0.7) of the device memory; the
rest is left for activations, communication buffers and fragmentation, which the estimate
does not count. Device memory is ``torch.cuda.mem_get_info`` total on a GPU, or the host's RAM
divided among the local ranks on the CPU. Rank 0 prints the decision and why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scaletrain.parallel.options import AUTO_ORDER

if TYPE_CHECKING:
    from scaletrain.runtime.env import Env

DEFAULT_FRACTION = 0.7


@dataclass(frozen=True, kw_only=True)
class AutoChoice:
    """The chosen strategy, the budget it was held to, and the estimate of each candidate."""

    strategy: str
    budget: int
    device_bytes: int
    estimates: dict[str, int]

    def reason(self) -> str:
        """One line: what was chosen and the numbers that decided it."""
        from scaletrain.parallel.memory import format_bytes

        tried = ", ".join(f"{name} {format_bytes(b)}" for name, b in self.estimates.items())
        return (f"strategy auto -> {self.strategy}: model state per rank {tried}; budget "
                f"{format_bytes(self.budget)} ({DEFAULT_FRACTION:.0%} of "
                f"{format_bytes(self.device_bytes)} device memory)")


def optimizer_kind(optimizer: Any) -> str:
    """The estimator's optimizer name for a torch optimizer (Adam when unknown: the largest)."""
    if optimizer is None:
        return "sgd"
    name = type(optimizer).__name__.lower()
    if name in ("sgd",):
        momentum = optimizer.defaults.get("momentum", 0) or 0
        return "sgd_momentum" if momentum else "sgd"
    if name in ("adam", "adamw", "rmsprop", "adagrad"):
        return name
    return "adam"


def device_memory(env: Env) -> int:
    """Bytes of memory one rank may use: its GPU's total, or its share of host RAM."""
    import torch

    device = torch.device(env.device)
    if device.type == "cuda":
        _free, total = torch.cuda.mem_get_info(device)
        return int(total)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(ram // max(env.local_world_size, 1))


def choose(model: Any, optimizer: Any, env: Env, precision: str, *,
           device_bytes: int | None = None, fraction: float = DEFAULT_FRACTION) -> AutoChoice:
    """Pick the first of ``AUTO_ORDER`` whose per-rank estimate fits the budget.

    On a world of one process only ``ddp`` (which then runs unwrapped) and ``offload`` make
    sense; ``offload`` is the last resort everywhere, chosen even if it does not fit.
    """
    from scaletrain.parallel.memory import estimate_memory

    total = device_memory(env) if device_bytes is None else int(device_bytes)
    budget = int(total * fraction)
    kind = optimizer_kind(optimizer)
    candidates = AUTO_ORDER if env.world_size > 1 else ("ddp", "offload")
    estimates: dict[str, int] = {}
    for name in candidates:
        est = estimate_memory(model, optimizer=kind, precision=precision, strategy=name,
                              world_size=env.world_size)
        estimates[name] = int(est.total)
        if est.total <= budget:
            return AutoChoice(strategy=name, budget=budget, device_bytes=total,
                              estimates=estimates)
    return AutoChoice(strategy=candidates[-1], budget=budget, device_bytes=total,
                      estimates=estimates)
