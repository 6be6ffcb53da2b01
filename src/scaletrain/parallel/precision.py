"""Numeric precision (fp32, tf32, bf16, fp16), loss scaling, and gradient accumulation.

Precisions:

- ``fp32``: nothing changes.
- ``tf32``: sets the two TF32 flags, ``torch.backends.cuda.matmul.allow_tf32``
  (matrix products) and ``torch.backends.cudnn.allow_tf32`` (convolutions). Numbers still
  fp32 in memory; only Ampere+ GPUs compute differently. Harmless elsewhere.
- ``bf16``: under DDP/none/zero1 the model's ``forward`` runs in ``torch.autocast`` and its
  floating outputs are cast back to fp32 (so the loss is fp32); under FSDP strategies the
  FSDP2 ``MixedPrecisionPolicy`` (bf16 compute, fp32 gradient reduction) does it instead.
  Works on CPU too.
- ``fp16``: as bf16 plus a gradient scaler: ``torch.amp.GradScaler`` for DDP strategies,
  ``ShardedGradScaler`` (which all-reduces the inf/NaN check over ranks) under FSDP.
  Allowed on CPU - slow, but it lets CI run the same code path as a GPU.

With fp16, call ``scaletrain.backward(loss)`` (it scales the loss); the optimizer returned by
``setup()`` then unscales, skips steps with inf/NaN gradients and updates the scale inside its
own ``step()``. A plain ``loss.backward()`` under fp16 is refused at ``step()`` rather than
silently dividing unscaled gradients. With fp32/tf32/bf16 a plain ``loss.backward();
optimizer.step()`` keeps working.

Gradient accumulation::

    acc = scaletrain.accumulate(model, steps=4)
    for x, y in loader:
        with acc:                                  # no gradient sync on micro-steps 1..3
            scaletrain.backward(loss_fn(model(x), y))   # divides the loss by 4
        if acc.sync:                               # True after the 4th micro-step
            optimizer.step(); optimizer.zero_grad()

It uses DDP's ``no_sync()`` or FSDP2's ``set_requires_gradient_sync(False)`` on the
non-final micro-steps, so it works on every strategy.

The names themselves (:class:`~scaletrain.parallel.options.PrecisionSpec`, ``PRECISIONS``,
``resolve_precision``) live with the strategies' in :mod:`scaletrain.parallel.options`, which
``plan`` reads on a login node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scaletrain import module_state, settings
from scaletrain.errors import StrategyError
from scaletrain.parallel.options import StrategySettingError

if TYPE_CHECKING:
    import torch

    from scaletrain.parallel.options import ParallelDims, PrecisionSpec, StrategySpec
    from scaletrain.parallel.sharding import Sharding
    from scaletrain.runtime.env import Env


def apply_flags(spec: PrecisionSpec) -> None:
    """Set the process-wide TF32 flags for ``tf32`` (other precisions leave them alone)."""
    import torch

    if spec.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def compute_dtype(spec: PrecisionSpec) -> torch.dtype | None:
    """The torch dtype of the precision's compute, or None for fp32/tf32."""
    import torch

    return getattr(torch, spec.compute_dtype) if spec.compute_dtype else None


def _to_fp32(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() and value.dtype != torch.float32 else value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_to_fp32(v) for v in value)
    if isinstance(value, list):
        return [_to_fp32(v) for v in value]
    if isinstance(value, dict):
        return type(value)((k, _to_fp32(v)) for k, v in value.items())
    return value


def wrap_forward_autocast(module: torch.nn.Module, spec: PrecisionSpec, device_type: str) -> None:
    """Make ``module.forward`` run under autocast and return fp32 floating outputs.

    Patching the instance's ``forward`` (before DDP wraps it) keeps ``module`` the same
    object, so DDP, hooks and ``state_dict`` see no difference.
    """
    import torch

    dtype = compute_dtype(spec)
    if dtype is None:
        return
    inner = module.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=dtype):
            out = inner(*args, **kwargs)
        return _to_fp32(out)

    module.forward = forward


def fsdp_mp_policy(spec: PrecisionSpec, *, root: bool = False) -> Any:
    """FSDP2 ``MixedPrecisionPolicy``: compute in bf16/fp16, reduce gradients in fp32.

    Only the root casts its outputs back to fp32 (so the loss is fp32); inner modules hand
    low-precision activations to the next module, whose parameters are low-precision too.
    """
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = compute_dtype(spec)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32,
                                output_dtype=torch.float32 if root else None)


# ----------------------------------------------------------------------------------------
# Per-setup state: what backward() and accumulate() need to know about a model.


@dataclass(kw_only=True)
class ParallelState:
    """What ``setup()`` decided for one model; attached to the model and the optimizer."""

    strategy: StrategySpec
    precision: PrecisionSpec
    dims: ParallelDims
    env: Env
    sharding: Sharding | None = None  # which state is split over ranks (checkpoints ask)
    scaler: Any = None  # GradScaler / ShardedGradScaler for fp16
    accumulator: Accumulator | None = None
    scaled_backward: bool = False  # a scaled backward() happened since the last step
    notes: list[str] = field(default_factory=list)


_ACTIVE: weakref.ReferenceType[ParallelState] | None = None
module_state.register(__name__, "_ACTIVE")
_STATES: weakref.WeakValueDictionary[int, ParallelState] = weakref.WeakValueDictionary()
_ATTR = "_scaletrain_state"


def attach_state(state: ParallelState, *objs: Any) -> None:
    """Remember ``state`` on ``objs`` and as the most recent one (for ``backward(loss)``)."""
    global _ACTIVE
    for obj in objs:
        if obj is not None:
            object.__setattr__(obj, _ATTR, state)
    _ACTIVE = weakref.ref(state)


def state_of(obj: Any = None) -> ParallelState | None:
    """The state attached to ``obj`` by ``setup()``, or the latest one when ``obj`` is None."""
    if obj is not None:
        return getattr(obj, _ATTR, None)
    return _ACTIVE() if _ACTIVE is not None else None


def make_scaler(spec: PrecisionSpec, *, sharded: bool, device_type: str) -> Any:
    """The loss scaler for fp16 (None otherwise): sharded-aware under FSDP."""
    if not spec.scaler:
        return None
    if sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=device_type)
    import torch

    return torch.amp.GradScaler(device_type)


def install_scaled_step(optimizer: Any, state: ParallelState) -> None:
    """Make ``optimizer.step()`` do unscale -> step (skipped on inf/NaN) -> update for fp16.

    The scaler calls ``optimizer.step`` itself; a re-entrancy flag sends that inner call to
    the original method.
    """
    scaler = state.scaler
    original = optimizer.step
    inside = False

    @functools.wraps(original)
    def step(*args: Any, **kwargs: Any) -> Any:
        nonlocal inside
        if inside:
            return original(*args, **kwargs)
        if not state.scaled_backward:
            raise StrategyError(
                "precision='fp16' scales the loss, but this step's gradients were not scaled",
                hint="call scaletrain.backward(loss) instead of loss.backward()")
        inside = True
        try:
            result = scaler.step(optimizer, *args, **kwargs)
            scaler.update()
        finally:
            inside = False
            state.scaled_backward = False
        return result

    optimizer.step = step


def _tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _module(value: Any) -> bool:
    """A module, or what setup() returned (a PipelineModel is not a Module)."""
    import torch

    return isinstance(value, torch.nn.Module) or getattr(value, _ATTR, None) is not None


# backward()'s and accumulate()'s arguments, in the settings vocabulary
LOSS = settings.Spec(doc="the scalar loss tensor of this (micro-)batch, e.g. scaletrain.backward(loss)",
                     check=settings.kind(_tensor, "a torch.Tensor"), error=StrategySettingError)
MODEL = settings.Spec(doc="the model scaletrain.setup() returned",
                      check=settings.kind(_module, "a torch.nn.Module"), error=StrategySettingError)
OPTIONAL_MODEL = dataclasses.replace(MODEL, optional=True)


def backward(loss: torch.Tensor, model: Any = None, **kwargs: Any) -> None:
    """``loss.backward()`` that scales for fp16 and averages over accumulation micro-steps.

    Args:
        loss: the scalar loss of this (micro-)batch.
        model: the model returned by ``setup()``; default the most recently set up one.
        **kwargs: passed to ``Tensor.backward`` (e.g. ``retain_graph``).
    """
    settings.check_value(LOSS, loss, "backward(): loss")
    settings.check_value(OPTIONAL_MODEL, model, "backward(): model")
    state = state_of(model)
    if state is not None and state.accumulator is not None and state.accumulator.active:
        loss = loss / state.accumulator.steps
    if state is not None and state.scaler is not None:
        loss = state.scaler.scale(loss)
        state.scaled_backward = True
    loss.backward(**kwargs)


# accumulate()'s steps, declared in the settings vocabulary
ACCUMULATE_STEPS = settings.Spec(doc="micro-batches per optimizer step, e.g. scaletrain.accumulate(model, steps=4)",
                                 check=settings.count(), error=StrategySettingError)


class Accumulator:
    """Gradient accumulation over ``steps`` micro-batches; use as ``with acc: ...``.

    Inside the block of a non-final micro-step gradient synchronisation is off (DDP
    ``no_sync``, FSDP2 ``set_requires_gradient_sync(False)``); on the final one it is on, and
    after the block ``acc.sync`` is True: time for ``optimizer.step()``.
    """

    def __init__(self, model: Any, steps: int) -> None:
        settings.check_value(MODEL, model, "accumulate(): model")
        settings.check_value(ACCUMULATE_STEPS, steps, "accumulate(): steps")
        self.model = model
        self.steps = steps
        self.count = 0  # micro-steps finished
        self.sync = False
        self.active = False
        self._ctx: contextlib.AbstractContextManager[Any] | None = None
        state = state_of(model)
        if state is not None:
            state.accumulator = self

    @property
    def micro_step(self) -> int:
        """Index of the current (or next) micro-step within its group, 0..steps-1."""
        return self.count % self.steps

    def __enter__(self) -> Accumulator:
        self.sync = self.micro_step == self.steps - 1
        self.active = True
        self._ctx = contextlib.nullcontext() if self.sync else _no_sync(self.model)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._ctx is not None  # set by __enter__
        self._ctx.__exit__(*exc)
        self._ctx = None
        self.active = False
        if exc[0] is None:
            self.count += 1


def accumulate(model: Any, steps: int) -> Accumulator:
    """A gradient-accumulation context over ``steps`` micro-batches for a ``setup()`` model."""
    return Accumulator(model, steps)


@contextlib.contextmanager
def _no_sync(model: Any):  # type: ignore[no-untyped-def]
    """Turn off gradient synchronisation on DDP or FSDP2 models; a no-op on plain ones."""
    if hasattr(model, "no_sync"):  # DistributedDataParallel (ddp, zero1)
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2 FSDPModule (zero2/3, hsdp, offload)
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield
