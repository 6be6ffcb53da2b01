"""The Monitor's buffered steps, turned into records and JSON lines only when a sink asks.

The training thread keeps its steps as columns (:class:`~scaletrain.observe.steplog.StepColumns`);
the writer thread wraps a batch of them in a :class:`StepBatch`. Each sink takes what it needs:
the console a record for the few steps it prints, TensorBoard every record, the JSONL file its
lines. The lines come from one format string per step rather than a dict and ``json`` (three
times cheaper: on the smallest models this formatting is most of what monitoring costs); any
step the template does not cover (extra fields, tokens, MFU, a non-finite loss, a non-integer
sample count) goes through ``json`` instead: the same fields either way (the template's rates to
7 significant digits).
"""

from __future__ import annotations

import json
import math
from typing import Any

from scaletrain.fileio import json_text
from scaletrain.observe.steplog import StepColumns

Record = dict[str, Any]

# a step as a tuple (StepColumns.row): (step, t, step_s, samples, tokens, loss, wait_s, comm_s, extra);
# extra is a dict of the step's extra fields, or None
STEP_FIELDS = ("step", "t", "step_s", "samples", "tokens", "loss", "data_wait_s", "comm_s", "extra")

# JSONL lines by default (``every=None``): one per step for the first DENSE_STEPS steps, then
# about one per LINE_SPACING_S of training (a line per step when steps take that long or more).
# Formatting a line and converting its loss cost ~3 us in Python, 1% of a 0.25 ms step; spaced,
# the file stays a readable curve at any step time (the summary still sees every step).
DENSE_STEPS = 100
LINE_SPACING_S = 0.01
_ROUND_STRIDES = tuple(m * 10 ** k for k in range(7) for m in (1, 2, 5))


def spaced_every(cols: StepColumns, spacing_s: float = LINE_SPACING_S) -> int:
    """The stride (1, 2, 5, 10, 20, 50, ...) that spaces a batch's lines about ``spacing_s`` apart."""
    n = len(cols)
    mean_s = (cols.ends[-1] - cols.ends[0]) / (n - 1) if n > 1 else (cols.step_time(0) if n else spacing_s)
    raw = spacing_s / mean_s * (1 + 1e-9) if mean_s > 0 else 1.0  # a clock's rounding never lowers a stride
    every = 1
    for stride in _ROUND_STRIDES:  # the largest round stride not above raw: regular step numbers
        if stride > raw:
            break
        every = stride
    return every


# A stride so large that no step number reaches it: "keep no loss".
NEVER = 1 << 62


def loss_stride(line_every: int | None, console_every: int | None) -> int:
    """Keep the losses of every N-th step only: those the JSONL lines (every ``line_every``-th
    step, None: no file) and the console lines (every ``console_every``-th, None: no console)
    show. Dropping the others at once lets the training thread free their autograd graphs,
    as it does without a monitor, instead of the writer thread freeing them later."""
    if line_every is None:
        return console_every if console_every is not None else NEVER
    return math.gcd(line_every, console_every) if console_every is not None else line_every


def retune(strides: tuple[bool, int | None, int | None, bool], cols: StepColumns, step: int,
           line_every: int, loss_every: int) -> tuple[int, int]:
    """A Monitor's JSONL stride in force and its loss stride, from the batch ``cols`` just
    handed over. ``strides``: (a JSONL file, its fixed ``jsonl_every``, the console's
    ``log_every`` or None, TensorBoard); TensorBoard logs every step's loss: nothing changes."""
    has_jsonl, fixed, console_every, tensorboard = strides
    if tensorboard:
        return line_every, loss_every
    line: int | None = None
    if has_jsonl:
        if fixed is None:
            line_every = spaced_every(cols) if step >= DENSE_STEPS else 1
        line = fixed or line_every
    return line_every, loss_stride(line, console_every)


# one step's JSON line for the common case (ints, finite floats, no tokens/MFU/extras): the same
# keys and values as json would write, times to 1 us, rates to 7 significant digits and the loss
# to 9 (a float32 loss exactly); tests/unit/test_observe_records.py holds the two paths together
_LINE = ('{"type": "step", "step": %d, "t": %.6f, "step_s": %.7g, "samples": %d, "loss": %s, '
         '"data_wait_s": %r, "peak_mem_gb": MEM, "samples_per_s": %s, '
         '"samples_per_s_per_device": %s, "data_wait_frac": %r}')
# the same without data wait (no loader wrapped): two fewer numbers to format
_LINE_NO_WAIT = _LINE.replace('%r, "peak', '0.0, "peak').replace('"data_wait_frac": %r', '"data_wait_frac": 0.0')


def _number(value: Any) -> float | None:
    """A float from a number or a one-element tensor (this synchronises a GPU tensor)."""
    if value is None:
        return None
    if hasattr(value, "item"):
        # a loss that became a vector after the first steps (only the first is checked): no number
        count = value.numel() if hasattr(value, "numel") else getattr(value, "size", 1)
        return float(value.item()) if count == 1 else math.nan
    try:
        return float(value)
    except OverflowError:   # an int past a float (only the first loss is checked): no number, as NaN
        return math.nan


def _floats(values: list[Any]) -> list[float | None]:
    """Floats from numbers and one-element tensors, the tensors in one stacked call.

    One call, not one ``.item()`` per step: each tensor call releases and retakes the GIL, and
    thousands of those hand-offs in this thread cost the training thread more than the
    conversion itself (and on a GPU, one synchronisation instead of one per step).
    """
    tensors = [v for v in values if hasattr(v, "detach")]
    if len(tensors) > 1:
        import torch

        with torch.no_grad():
            try:  # no per-tensor call for 0-dim losses (the usual case): ndim is an attribute
                flat = iter(torch.stack(tensors if all(t.ndim == 0 for t in tensors)
                                        else [t.reshape(()) for t in tensors]).tolist())
            except RuntimeError:  # different devices or not one element: one by one
                flat = iter([_number(t) for t in tensors])
        return [next(flat) if hasattr(v, "detach") else _number(v) for v in values]
    return [v if type(v) is float or v is None else _number(v) for v in values]


def encode(record: Record) -> str:
    """One JSON line for ``record`` (NaN and infinity written as null)."""
    try:
        return _ENCODE(record)
    except ValueError:  # NaN/inf somewhere (a diverged loss): rare, so cleaned only then
        return json_text(record, default=str)   # NaN/inf as null, nested ones too


_ENCODE = json.JSONEncoder(default=str, allow_nan=False).encode


class StepBatch:
    """A hand-over of buffered steps with what is needed to turn them into records.

    Args:
        cols: the steps, as the Monitor buffered them.
        mem_gb: peak memory read when the batch was handed over (one reading per batch).
        world_size: processes in the job, for the global rates.
        mfu_scale: FLOPs per sample / peak FLOP/s, or None when MFU is not computed.
        line_every: the JSONL stride the Monitor kept losses for, when it chose one.
    """

    def __init__(self, cols: StepColumns, *, mem_gb: float, world_size: int,
                 mfu_scale: float | None = None, line_every: int | None = None) -> None:
        self.cols = cols
        self.line_every = line_every
        self.mem_gb = mem_gb
        self.world_size = world_size
        self.mfu_scale = mfu_scale
        self._losses: list[float | None] | None = None
        self._losses_of: dict[int, float | None] = {}   # the losses lines() converted, by index
        self._records: list[Record] | None = None

    def __len__(self) -> int:
        return len(self.cols)

    def losses(self) -> list[float | None]:
        """Every step's loss as a float or None: tensors converted here, off the training thread, once."""
        if self._losses is None:
            kept, first = self.cols.losses, self.cols.first
            self._losses = _floats([kept.get(first + i) for i in range(len(self.cols))])
        return self._losses

    def newest_loss(self) -> int | None:
        """The index of the last step whose loss was kept, None when none was."""
        kept = self.cols.losses
        return max(kept) - self.cols.first if kept else None

    def record(self, i: int) -> Record:
        """Step ``i`` of the batch as a record (the JSONL step line's fields, without ``type``)."""
        if self._records is not None:
            return self._records[i]
        step, t, step_s, samples, tokens, _, wait, _, extra = self.cols.row(i)
        loss = self._losses_of[i] if i in self._losses_of else self.losses()[i]
        rec: Record = {"step": step, "t": t, "step_s": step_s, "samples": samples, "loss": loss,
                       "data_wait_s": wait, "peak_mem_gb": self.mem_gb,
                       "samples_per_s": samples * self.world_size / step_s,
                       "samples_per_s_per_device": samples / step_s,
                       "data_wait_frac": min(1.0, wait / step_s)}
        if tokens:  # fields that do not apply are left out, not written as null
            rec["tokens"] = tokens
            rec["tokens_per_s"] = tokens * self.world_size / step_s
        if self.mfu_scale:
            rec["mfu"] = self.mfu_scale * samples / step_s
        for key, value in (extra or {}).items():
            rec[key] = _number(value) if hasattr(value, "item") else value
        return rec

    def records(self) -> list[Record]:
        """Every step as a record (built once)."""
        if self._records is None:
            self._records = [self.record(i) for i in range(len(self.cols))]
        return self._records

    def chosen(self, every: int, dense: int = 0) -> list[int] | range:
        """The indices of the steps whose number is a multiple of ``every`` or at most ``dense``."""
        first, n = self.cols.first, len(self.cols)
        if every <= 1:
            return range(n)
        head = range(0, min(n, max(0, dense - first + 1)))   # the dense steps of this batch
        lo = len(head) + (-(first + len(head))) % every      # the first multiple past them
        return [*head, *range(lo, n, every)]

    def lines(self, every: int | None = 1) -> str:
        """The batch as JSONL text: one ``{"type": "step", ...}`` line per step, or per
        ``every``-th step (step numbers divisible by it), or with ``every=None`` spaced by time
        (:func:`spaced_every`, every step up to DENSE_STEPS); the losses of the other steps are
        never converted."""
        cols = self.cols
        if every is None:
            chosen = self.chosen(self.line_every or spaced_every(cols), DENSE_STEPS)
        else:
            chosen = self.chosen(every)
        losses: dict[int, float | None] | list[float | None]
        if isinstance(chosen, list) and self._losses is None:
            first, kept = cols.first, cols.losses
            self._losses_of = dict(zip(chosen, _floats([kept.get(first + i) for i in chosen])))
            losses = self._losses_of
        else:
            losses = self.losses()
        world = self.world_size
        simple = self.mfu_scale is None and isinstance(self.mem_gb, float) and math.isfinite(self.mem_gb)
        mem = repr(self.mem_gb)
        line, line_no_wait = _LINE.replace("MEM", mem), _LINE_NO_WAIT.replace("MEM", mem)
        isfinite = math.isfinite
        first, t0, ends, all_samples = cols.first, cols.t0, cols.ends, cols.samples
        waits, odd = cols.waits, cols.tokens or cols.extras
        out = []
        for i in chosen:
            step, samples, loss = first + i, all_samples[i], losses[i]
            if (simple and not (odd and (step in cols.tokens or step in cols.extras)) and type(samples) is int
                    and (loss is None or isfinite(loss))):
                step_s = cols.step_time(i)
                per_device = samples / step_s
                rate = "%.7g" % per_device
                text = "null" if loss is None else "%.9g" % loss
                total = rate if world == 1 else "%.7g" % (per_device * world)
                wait = waits.get(step, 0.0)
                if wait == 0.0:
                    out.append(line_no_wait % (step, ends[i] - t0, step_s, samples, text, total, rate))
                else:
                    frac = wait / step_s
                    out.append(line % (step, ends[i] - t0, step_s, samples, text, float(wait), total, rate,
                                       frac if frac < 1.0 else 1.0))
            else:
                out.append(encode({"type": "step", **self.record(i)}))
        return "\n".join(out) + "\n" if out else ""
