"""What the Monitor accepts from the training loop, and what it does when its files fail.

Checked where it is cheap: ``samples`` with one type test and one comparison per step, the loss
only when its type changes (a tensor's shape is looked at once, on the first tensor), so the
step path stays a few hundred nanoseconds. A file the Monitor cannot write is an error before
training (the folder) and a warning during it (a full disk): metrics are never worth a crash.
"""

from __future__ import annotations

import numbers
import os
import warnings
from pathlib import Path
from typing import Any

from scaletrain import settings
from scaletrain.errors import UsageError


class MonitorWriteWarning(UserWarning):
    """The Monitor could not write its files (a full disk, a folder made read-only); training goes on."""


# The most samples one step of one process may count: far past any batch, and exact as a float
# (the rates divide by it). The step path tests an int against it, one comparison.
MAX_SAMPLES = 10**15


def _real(value: Any) -> float | None:
    """``value`` as a float when it is a real number (not a bool) a float can hold, else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:   # an int past a float's range (10**400)
        return None


def _samples(value: Any) -> Any:
    """Any real number (numpy's too) from 0 to MAX_SAMPLES, as given."""
    number = _real(value)
    if number is None or not 0 <= number <= MAX_SAMPLES:   # NaN fails the comparison too
        raise settings.Bad(f"a count >= 0 and at most {MAX_SAMPLES:.0e}")
    return value


# Monitor.step's samples, in the settings vocabulary (checked off the step path: the usual int
# is tested against the bounds by the step itself)
SAMPLES = settings.Spec(doc="pass the number of samples this process trained on in the step, e.g. samples=len(batch)",
                        check=_samples)


def check_samples(samples: Any) -> int | float:
    """``samples`` as a count from 0 to MAX_SAMPLES (an int, or a finite float); SettingError otherwise."""
    settings.check_value(SAMPLES, samples, "Monitor.step: samples")
    return int(samples) if isinstance(samples, numbers.Integral) else float(samples)


TOKENS = settings.Spec(doc="the tokens this process trained on in the step, e.g. tokens=batch.numel()",
                       check=_samples)
DATA_WAIT = settings.Spec(doc="seconds blocked on data in the step (leave it out when Monitor.data measures it)",
                          check=settings.number(low=0, high=86400.0), unit="seconds", optional=True)


def check_more(more: dict[str, Any]) -> None:
    """``Monitor.step``'s other figures: ``tokens`` a count, ``data_wait_s`` seconds, and no extra
    field an int past a float (NaN and text pass: a field is the program's own, the JSON line
    keeps it as given). SettingError/UsageError before anything is recorded."""
    if more.get("tokens") is not None:
        settings.check_value(TOKENS, more["tokens"], "Monitor.step: tokens")
    if "data_wait_s" in more:
        settings.check_value(DATA_WAIT, more["data_wait_s"], "Monitor.step: data_wait_s")
    for key, value in more.items():
        if isinstance(value, int) and not isinstance(value, bool) and _real(value) is None:
            raise UsageError(f"Monitor.step: {key} = {str(value)[:20]}... is past a float's range",
                             "log a number a float holds (TensorBoard and the rates convert it)")


def check_loss(loss: Any) -> None:
    """Raise UsageError unless ``loss`` is a real number or a one-element tensor/array."""
    if hasattr(loss, "numel"):  # a tensor: its shape, once (no device synchronisation)
        if loss.numel() == 1 and not loss.is_complex():
            return
        shape = tuple(loss.shape)
    elif hasattr(loss, "size") and hasattr(loss, "dtype"):  # a numpy array or scalar
        if loss.size == 1 and getattr(loss.dtype, "kind", "") in "biuf":
            return
        shape = tuple(getattr(loss, "shape", ()))
    elif _real(loss) is not None:   # NaN and inf pass: a diverged loss is shown as one
        return
    else:
        raise UsageError(f"Monitor.step: loss must be a number or a one-element tensor, got "
                         f"{type(loss).__name__} {str(loss)[:40]!r}",
                         "pass the scalar loss, e.g. loss=loss.detach() (or leave loss out)")
    raise UsageError(f"Monitor.step: loss must be one number, got a tensor of shape {shape}",
                     "reduce it first, e.g. loss=loss.mean().detach()")


def check_run_dir(run_dir: Path) -> None:
    """Create ``run_dir``, or say in one line why the Monitor cannot write there."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"Monitor: {run_dir} exists and is not a folder",
                         "pass a folder for run_dir (metrics.jsonl and summary.json go in it)") from None
    except OSError as exc:
        raise UsageError(f"Monitor: cannot create {run_dir}: {exc.strerror or exc}",
                         "pass a folder you can write, or run_dir=None for the console only") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise UsageError(f"Monitor: cannot write in {run_dir}: permission denied",
                         "pass a folder you can write, or run_dir=None for the console only")


def warn_write_failure(run_dir: Path | None, exc: BaseException) -> None:
    """One warning that the metrics could not be written (the caller warns once)."""
    what = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    warnings.warn(f"scaletrain.Monitor: could not write the metrics in {run_dir}: {what}; "
                  "training goes on without them", MonitorWriteWarning, stacklevel=3)
