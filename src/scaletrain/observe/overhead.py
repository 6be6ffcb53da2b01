"""The cost of running distributed at all, and its calibration by a measured 2-process run.

A data-parallel step at N > 1 pays more than its all-reduce: every rank waits for the slowest
(stragglers), DDP's bucket boundaries and hooks cost kernel launches and synchronisations, and
NCCL/gloo's own set-up per call adds latency. Published scaling tables show this cost as a drop
already from 1 to 2 GPUs where the all-reduce itself is hidden (docs/benchmarks.md, "Scaling
ranges on runs nobody fitted"), then a slow growth::

    overhead(1) = 0
    overhead(N) = base(step at N) x (1 + GROWTH x log2(N / 2))        N >= 2

``step at N`` is each GPU's own step as it is at N: the 1-GPU step under weak scaling, a share of
it when one global batch is split (strong scaling), so that the overhead shrinks with the work
it rides on. In seconds it is neither constant nor proportional to that step: it goes as
``step ** STEP_EXPONENT`` (the same models in fp32 and mixed precision: exponents 0.4-0.6).

``base`` calibrated is what a short ``bench scaling`` run at 1 and 2 processes measured beyond
the model's own terms, carried to another step by (step ratio) ** STEP_EXPONENT; its range goes
from "the same seconds" to "proportional", widened by CALIBRATION_SPREAD of the step (what one
short run leaves uncertain: a calibration that measured no overhead at all still prints a range).
Uncalibrated, it is DEFAULT_FRACTION of a REFERENCE_STEP_S step carried the same way, and the
range is the published runs' spread, from a stack that loses almost nothing (0) to the fitted
tables' largest. GROWTH is the fitted tables' median growth per doubling; GROWTH_RANGE spans them.

Calibrations are kept per cluster in ``~/.config/scaletrain/scaling-calibration.json`` (beside
the user's cluster profiles), written whole or not at all, so that ``plan --explain`` on the
same cluster finds them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.fileio import atomic_write, json_text, read_json

# Fitted on the tables of published_tables.FIT only (benchmarks/published_scaling.py shows the fit;
# tests/unit/test_scaling_published.py re-fits them and fails when these drift from the data).
GROWTH = 0.28                    # overhead growth per doubling of N beyond 2: the fits' median
GROWTH_RANGE = (0.20, 0.51)      # the growth each fitted point implies alone (0.201 ... 0.505)
REFERENCE_STEP_S = 0.1           # the default is stated for a 100 ms step
DEFAULT_FRACTION = 0.146         # overhead at 2 GPUs / a 100 ms step: the fitted per-step tables' median
FRACTION_RANGE = (0.012, 0.188)  # the smallest and largest of every fitted table (BART 0.012 ... GNMT 0.188)
STEP_EXPONENT = 0.5              # overhead seconds ~ step ** 0.5 (fp32 against mixed precision)
CALIBRATION_SPREAD = 0.015       # of each GPU's step: the smallest that holds 90% of the fitted points calibrated
CALIBRATION_FILE = "scaling-calibration.json"
_BOUNDS = ("low", "mid", "high")


@dataclass(frozen=True, kw_only=True)
class Overhead:
    """The per-step cost of running distributed: calibrated seconds, or the published default."""

    at_two_s: float | None = None    # measured overhead at 2 processes (None: not calibrated)
    at_step_s: float | None = None   # ... with this per-GPU step (None: the explained step itself)
    fraction: float = DEFAULT_FRACTION
    fraction_range: tuple[float, float] = FRACTION_RANGE
    growth: float = GROWTH
    growth_range: tuple[float, float] = GROWTH_RANGE
    spread: float = CALIBRATION_SPREAD
    source: str = "not calibrated: the median of published multi-GPU runs"

    @property
    def calibrated(self) -> bool:
        return self.at_two_s is not None

    def seconds(self, step_s: float, n: int, bound: str = "mid") -> float:
        """Overhead per step at ``n`` devices for a per-GPU step (at ``n``) of ``step_s``; ``bound``
        "low"/"high" gives the ends of the range (the least and the most overhead)."""
        if bound not in _BOUNDS:
            raise ValueError(f"bound must be one of {_BOUNDS}")
        if n <= 1:
            return 0.0
        i = _BOUNDS.index(bound)
        growth = (self.growth_range[0], self.growth, self.growth_range[1])[i]
        if self.at_two_s is not None:
            ratio = step_s / self.at_step_s if self.at_step_s else 1.0
            base = self.at_two_s * (min(1.0, ratio), ratio ** STEP_EXPONENT, max(1.0, ratio))[i]
            base = max(0.0, base + (-1, 0, 1)[i] * self.spread * step_s)
        else:
            fraction = (self.fraction_range[0], self.fraction, self.fraction_range[1])[i]
            base = fraction * REFERENCE_STEP_S * (step_s / REFERENCE_STEP_S) ** STEP_EXPONENT
        return base * (1 + growth * math.log2(n / 2))


NONE = Overhead(at_two_s=0.0, growth=0.0, growth_range=(0.0, 0.0), spread=0.0, source="none (arithmetic only)")


def calibrate(measured_s: float, modelled_s: float, n: int, *, step_s: float, source: str,
              growth: float = GROWTH, exposed_s: float = 0.0) -> Overhead:
    """The overhead that makes the model's step at ``n`` (``modelled_s``, without overhead, of which
    ``exposed_s`` is communication not hidden) the measured one, for a per-GPU step (compute, at
    ``n``) of ``step_s``. The model counts exposed communication and the overhead once (the larger
    of the two: a rank waiting for a straggler waits inside the all-reduce), so the overhead is the
    exposed part plus what the measurement adds to it; a measurement faster than the model is
    noise, not a gain."""
    if n < 2:
        raise ValueError("a calibration needs a run on at least 2 processes")
    extra = exposed_s + max(0.0, measured_s - modelled_s)
    return Overhead(at_two_s=extra / (1 + growth * math.log2(n / 2)), at_step_s=step_s, growth=growth,
                    source=source)


def to_record(overhead: Overhead, **what: Any) -> dict[str, Any]:
    """A calibration as ``bench scaling`` stores it (``what``: cluster, workload, host ...)."""
    return {"at_two_s": overhead.at_two_s, "at_step_s": overhead.at_step_s, "source": overhead.source, **what}


def from_record(record: Any) -> Overhead | None:
    """The calibration a stored record holds, or None when it is not one (the one reader of
    :func:`to_record`'s records: the calibration file and a ``scaling.json``)."""
    if not isinstance(record, dict):
        return None
    value, step = record.get("at_two_s"), record.get("at_step_s")
    if not isinstance(value, (int, float)) or not 0 <= value < 1e4:
        return None
    if not isinstance(step, (int, float)) or not 0 < step < 1e6:
        step = None
    return Overhead(at_two_s=float(value), at_step_s=None if step is None else float(step),
                    source=str(record.get("source") or "a stored calibration"))


def calibration_path() -> Path:
    """``$XDG_CONFIG_HOME/scaletrain/scaling-calibration.json`` (``~/.config`` by default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "scaletrain" / CALIBRATION_FILE


def _read_all(path: Path) -> dict[str, Any]:
    try:
        doc = read_json(path) if path.is_file() else {}
    except (OSError, ValueError):
        return {}      # a damaged file is as good as none: the next calibration replaces it
    return doc if isinstance(doc, dict) else {}


def save_calibration(cluster: str, record: dict[str, Any], *, path: Path | None = None) -> Path:
    """Store ``record`` (:func:`to_record`) as ``cluster``'s calibration."""
    path = path or calibration_path()
    doc = _read_all(path)
    doc[cluster] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, json_text(doc, indent=2, sort_keys=True) + "\n")


def load_calibration(cluster: str, *, path: Path | None = None) -> Overhead | None:
    """``cluster``'s stored calibration, or None when there is none (or it is unreadable)."""
    return from_record(_read_all(path or calibration_path()).get(cluster))
