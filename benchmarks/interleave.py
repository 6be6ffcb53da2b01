"""Speed ratios that mean something: variants timed interleaved, the median of paired ratios.

Timing variant A, then B, once each, in a fixed order, measures the order as much as the
variants: the card's clocks and caches warm, other processes come and go (the GPU acceptance
run read ddp at 1.08x, 1.21x, then 0.80x of the same loop this way). :func:`interleaved` times
them in rounds, each round one block of every variant in a rotating order, and compares each
variant with the baseline's block of the same round.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

def interleaved(blocks: dict[str, Callable[[], float]], baseline: str, *, rounds: int = 7) -> dict[str, Any]:
    """Each variant's time against ``baseline``'s, measured interleaved (ABAB...).

    A round times one block of every variant (a block returns its seconds), in an order that
    rotates from round to round so no variant always runs first or after the same one; a
    warm-up round comes first and is not counted. For each variant: the median of its
    ``rounds`` per-round ratios to the baseline's block of the same round, and their spread
    (the largest distance of a round's ratio from that median), so that "1.00 +- 0.02" can
    be told from a difference.
    """
    names = list(blocks)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(-1, rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t = blocks[name]()
            if r >= 0:
                times[name].append(t)
    out: dict[str, Any] = {"rounds": rounds}
    for name in names:
        out[f"{name}_ms"] = round(statistics.median(times[name]) * 1e3, 3)
    for name in names:
        if name != baseline:
            ratios = [t / b for t, b in zip(times[name], times[baseline])]
            median = statistics.median(ratios)
            out[f"{name}_vs_{baseline}"] = round(median, 3)
            out[f"{name}_vs_{baseline}_spread"] = round(max(abs(x - median) for x in ratios), 3)
    return out
