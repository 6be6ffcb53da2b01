"""``scaletrain run --cpu``: where a program puts tensors and modules on a GPU, put them on the CPU.

A GPU is named in many ways: ``"cuda"``, ``"cuda:1"``, ``torch.device("cuda", 1)``, a bare
integer (``model.to(local_rank)``, ``x.to(torch.cuda.current_device())``, ``device=rank``) and
``torch.device(rank)``, which on a CPU-only torch fails before anything is placed. Tensor
placement goes through torch functions, so a TorchFunctionMode maps them; a mode is per thread,
so every thread the program starts enters one too (:func:`cover_threads`). Module placement
(``Module.to``/``.cuda``) parses its arguments in C++ and is patched directly.

The mapping's own frames sit between the program and torch: a warning torch gives about the
program's call (a C++ ``TORCH_WARN`` names the innermost Python frame, a Python one its caller)
would name this file. :func:`attribute_warnings` shows it at the program's line instead.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from types import FrameType, ModuleType
from typing import Any, TextIO


def is_gpu(device: Any) -> bool:
    """True for a CUDA device in any spelling, an integer index included (not a bool)."""
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True
    text = str(device) if device is not None else ""
    return text == "cuda" or text.startswith("cuda:")


def _cpu_args(args: tuple[Any, ...], first: int) -> tuple[Any, ...]:
    """``args`` with a GPU at position ``first`` (a ``.to(device, ...)`` call) made "cpu"."""
    return tuple("cpu" if i == first and is_gpu(a) else a for i, a in enumerate(args))


def cpu_mode(torch: ModuleType) -> Any:
    """A TorchFunctionMode that places on the CPU what the program places on a GPU."""
    from torch.overrides import TorchFunctionMode

    tensor_to = torch.Tensor.to
    keep_self = {torch.Tensor.cuda, torch.Tensor.pin_memory}  # on the CPU already: itself
    no_op = {torch.Tensor.record_stream}

    class CpuMode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            if func in keep_self:
                return args[0]
            if func in no_op:
                return None
            kwargs = dict(kwargs or {})
            if is_gpu(kwargs.get("device")):
                kwargs["device"] = "cpu"
            if func is tensor_to:
                args = _cpu_args(tuple(args), 1)
            return func(*args, **kwargs)

    return CpuMode


def _mapping_class(real: type, convert: Any) -> type:
    """A stand-in for torch's C class ``real`` whose calls go through ``convert(args, kwargs)``
    and whose instances are ``real``'s own, so ``isinstance``, equality and pickling hold."""

    class _Meta(type):
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, real)

        def __subclasscheck__(cls, sub: Any) -> bool:
            return isinstance(sub, type) and issubclass(sub, real)

        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = convert(args, kwargs)
            return real(*args, **kwargs)

    return _Meta(real.__name__, (), {"_scaletrain_real": real, "__module__": "torch",
                                     "__doc__": real.__doc__})


def _device_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    if len(args) == 1 and not kwargs and isinstance(args[0], int) and not isinstance(args[0], bool):
        return ("cuda", args[0]), kwargs  # torch.device(rank): the GPU of that index
    return args, kwargs


def _generator_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    if is_gpu(kwargs.get("device")):
        kwargs = {**kwargs, "device": "cpu"}
    return _cpu_args(args, 0), kwargs


def patch_device(torch: ModuleType) -> None:
    """``torch.device(rank)`` is ``cuda:rank``, as on a GPU node; ``torch.Generator("cuda")`` and
    ``torch.set_default_device("cuda")`` are the CPU's. Everything else is torch's own."""
    if hasattr(torch.device, "_scaletrain_real"):
        return
    setattr(torch, "device", _mapping_class(torch.device, _device_args))
    setattr(torch, "Generator", _mapping_class(torch.Generator, _generator_args))
    original_default = torch.set_default_device

    @functools.wraps(original_default)
    def set_default_device(device: Any) -> None:
        original_default("cpu" if is_gpu(device) else device)

    setattr(torch, "set_default_device", set_default_device)


def patch_module(torch: ModuleType) -> None:
    """``Module.cuda(...)`` keeps the module where it is; ``Module.to(gpu, ...)`` becomes ``to("cpu")``."""
    module_cls = torch.nn.Module
    original_to = module_cls.to

    @functools.wraps(original_to)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if is_gpu(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return original_to(self, *_cpu_args(args, 0), **kwargs)

    setattr(module_cls, "to", to)
    setattr(module_cls, "cuda", lambda self, device=None: self)


def patch_load(torch: ModuleType) -> None:
    """``torch.load`` loads to the CPU whatever ``map_location`` says."""
    original = getattr(torch, "load")

    @functools.wraps(original)
    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs["map_location"] = "cpu"  # any CUDA placement, dict or callable: the CPU
        return original(*args, **kwargs)

    setattr(torch, "load", load)


def patch_ddp(torch: ModuleType) -> None:
    """DistributedDataParallel's ``device_ids``/``output_device`` name GPUs: dropped."""
    from torch.nn.parallel import distributed

    cls = distributed.DistributedDataParallel
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, module: Any, device_ids: Any = None, output_device: Any = None,
                 *args: Any, **kwargs: Any) -> None:
        original(self, module, None, None, *args, **kwargs)

    setattr(cls, "__init__", __init__)


def patch_device_mesh(mesh_module: ModuleType) -> None:
    """``DeviceMesh("cuda", ...)`` (and ``init_device_mesh("cuda", ...)``) is a CPU mesh.

    FSDP2 and tensor parallel take their device from the mesh, so both then run on gloo with
    CPU tensors throughout, as they do on a CPU mesh.
    """
    cls = getattr(mesh_module, "DeviceMesh", None)
    if cls is None or getattr(cls.__init__, "_scaletrain_cpu", False):
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, device_type: Any, *args: Any, **kwargs: Any) -> None:
        original(self, "cpu" if is_gpu(device_type) else device_type, *args, **kwargs)

    setattr(__init__, "_scaletrain_cpu", True)
    setattr(cls, "__init__", __init__)


def cover_threads(mode_cls: type) -> None:
    """Enter a CPU mode in every thread started from now on (a mode is per thread), and leave
    it before the thread ends.

    Why leave it: torch keeps a thread's modes in a C++ thread_local, whose destructor runs
    after the thread's Python part has ended (``join()`` may have returned already): it checks
    that Python is still initialized, then takes the GIL to release the mode's Python object.
    When the main thread starts finalizing in between (a loaded machine deschedules the
    ending thread, or the main thread keeps the GIL into Py_FinalizeEx), CPython ends the
    thread with pthread_exit inside that noexcept destructor and the process aborts at exit:
    "terminate called without an active exception". Popped here, under the GIL, the mode
    leaves the destructor nothing to release.
    """
    original = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]
    if getattr(original, "_scaletrain_cpu", False):
        return

    def _bootstrap_inner(self: threading.Thread) -> None:
        try:
            mode = mode_cls()
            mode.__enter__()
        except Exception:  # noqa: BLE001 - torch is shutting down: run the thread unmapped
            original(self)
            return
        try:
            original(self)
        finally:
            try:
                mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - torch is shutting down: nothing left to pop
                pass

    setattr(_bootstrap_inner, "_scaletrain_cpu", True)
    setattr(threading.Thread, "_bootstrap_inner", _bootstrap_inner)


def _mapping_files() -> frozenset[str]:
    here = os.path.dirname(os.path.realpath(__file__))
    return frozenset(os.path.join(here, name) for name in ("cpu_map.py", "cpu_cuda.py"))


def _overrides_file() -> str:
    overrides = sys.modules.get("torch.overrides")
    return os.path.realpath(getattr(overrides, "__file__", "") or "")


def _program_frame(filename: str, lineno: int) -> FrameType | None:
    """The frame the mapping's frame at ``filename:lineno`` stands in front of: the first one
    outward that is neither the mapping's nor torch's function-mode dispatch."""
    skip = _mapping_files() | {_overrides_file()}
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and not (frame.f_code.co_filename == filename
                                     and frame.f_lineno == lineno):
        frame = frame.f_back
    while frame is not None and os.path.realpath(frame.f_code.co_filename) in skip:
        frame = frame.f_back
    return frame


def attribute_warnings() -> None:
    """Show a warning raised inside the mapping's frames at the program's frame that called
    into them (``warnings.showwarning`` wraps the one in place; a program that installs its
    own later, such as ``logging.captureWarnings``, gets the mapping's file as before)."""
    shown = warnings.showwarning
    if getattr(shown, "_scaletrain_cpu", False):
        return
    ours = _mapping_files()

    def showwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    file: TextIO | None = None, line: str | None = None) -> None:
        if os.path.realpath(filename) in ours:
            frame = _program_frame(filename, lineno)
            if frame is not None:
                filename, lineno, line = frame.f_code.co_filename, frame.f_lineno, None
        shown(message, category, filename, lineno, file, line)

    setattr(showwarning, "_scaletrain_cpu", True)
    warnings.showwarning = showwarning
