"""``scaletrain run --cpu``: smoke-test a program written for CUDA and NCCL on CPU processes.

Inside the workers of that run only (the worker shim applies it when the program imports
torch), and loudly (the launcher says so at the start and the end):

- ``init_process_group(backend="nccl")`` uses gloo; its ``device_id`` is dropped;
- ``.cuda()``, ``.to("cuda")``, ``device="cuda"`` in factory functions and
  ``torch.load(map_location="cuda:0")`` stay on, or map to, the CPU;
- ``torch.cuda.set_device``/``synchronize``/``manual_seed``... are no-ops, and
  ``is_available()`` says True and ``device_count()`` the workers per node, so a program that
  checks them proceeds and computes the same local ranks as on a GPU node;
- ``DistributedDataParallel(device_ids=[...], output_device=...)`` drops the device lists.

Device mapping uses a TorchFunctionMode, which is per thread: tensors a program creates on
CUDA in a thread it starts itself are not mapped (DataLoader workers are processes and are).
Without ``--cpu`` on a machine with no GPU, a CUDA-only program fails with one line and the
hint to use ``--cpu`` instead of a CUDA traceback (:func:`install_cuda_missing_hook`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from types import ModuleType, SimpleNamespace
from typing import Any

from scaletrain.launch import frames

BANNER = ("CPU smoke test (--cpu): CUDA calls run on CPU processes and NCCL is gloo; "
          "it checks that the program runs and its ranks agree, not its speed or GPU numbers")

# First lines of the errors a CUDA-only program raises where there is no GPU.
CUDA_MISSING = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver",
                "No CUDA GPUs are available", "doesn't have NCCL built in",
                "Attempting to deserialize object on a CUDA device",
                "ProcessGroupNCCL is only supported with GPUs", "CUDA driver initialization failed",
                "Cannot access accelerator device when none is available")


def _is_cuda(device: Any) -> bool:
    text = str(device) if device is not None else ""
    return text == "cuda" or text.startswith("cuda:")


def _workers_per_node() -> int:
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def _cpu_mode(torch: ModuleType) -> Any:
    from torch.overrides import TorchFunctionMode

    tensor_to = torch.Tensor.to
    keep_self = {torch.Tensor.cuda, torch.Tensor.pin_memory}  # on the CPU already: itself

    class CpuMode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func in keep_self:
                return args[0]
            if _is_cuda(kwargs.get("device")):
                kwargs["device"] = "cpu"
            if func is tensor_to:
                args = tuple("cpu" if (i == 1 and (isinstance(a, int) and not isinstance(a, bool)
                                                   or _is_cuda(a))) else a
                             for i, a in enumerate(args))
            return func(*args, **kwargs)

    return CpuMode()


class _Event:
    """torch.cuda.Event on the CPU clock: record/synchronize/elapsed_time in milliseconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.t = 0.0

    def record(self, *args: Any) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def wait(self, *args: Any) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Event) -> float:
        return (end.t - self.t) * 1000.0


def _patch_cuda(torch: ModuleType) -> None:
    cuda = torch.cuda
    current = {"device": 0}
    per_node = _workers_per_node()

    def set_device(device: Any) -> None:
        index = getattr(device, "index", device)
        current["device"] = int(index) if isinstance(index, int) else 0

    props = SimpleNamespace(name="CPU (scaletrain run --cpu)", major=8, minor=0,
                            total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                            multi_processor_count=os.cpu_count() or 1)
    values: dict[str, Any] = {
        "is_available": lambda: True, "device_count": lambda: per_node,
        "set_device": set_device, "current_device": lambda: current["device"],
        "device": lambda *a, **k: contextlib.nullcontext(),
        "get_device_name": lambda *a: props.name, "get_device_capability": lambda *a: (8, 0),
        "get_device_properties": lambda *a: props, "is_bf16_supported": lambda *a, **k: True,
        "Event": _Event, "is_initialized": lambda: True,
    }
    for name in ("synchronize", "empty_cache", "manual_seed", "manual_seed_all", "init",
                 "reset_peak_memory_stats", "reset_max_memory_allocated", "ipc_collect"):
        values[name] = lambda *a, **k: None
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved"):
        values[name] = lambda *a, **k: 0
    for name, value in values.items():
        setattr(cuda, name, value)


def _patch_load(torch: ModuleType) -> None:
    original = getattr(torch, "load")

    @functools.wraps(original)
    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs["map_location"] = "cpu"  # any CUDA placement, dict or callable: the CPU
        return original(*args, **kwargs)

    setattr(torch, "load", load)


def _patch_ddp() -> None:
    from torch.nn.parallel import distributed

    cls = distributed.DistributedDataParallel
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, module: Any, device_ids: Any = None, output_device: Any = None,
                 *args: Any, **kwargs: Any) -> None:
        original(self, module, None, None, *args, **kwargs)

    setattr(cls, "__init__", __init__)


def patch_torch(torch: ModuleType) -> None:
    """Apply the CPU mapping to an imported torch (the hook on ``import torch``)."""
    _patch_cuda(torch)
    _patch_load(torch)
    _patch_ddp()
    setattr(torch.nn.Module, "cuda", lambda self, device=None: self)
    mode = _cpu_mode(torch)
    mode.__enter__()  # for the life of the process, like torch.set_default_device


def patch_c10d(c10d: ModuleType) -> None:
    """``init_process_group``: NCCL (or a "cuda:nccl" pair) becomes gloo, device_id dropped."""
    original = getattr(c10d, "init_process_group")

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("device_id", None)
        if args:
            backend, args = args[0], args[1:]
        else:
            backend = kwargs.pop("backend", None)
        if backend is None or "nccl" in str(backend).lower():
            backend = "gloo"
        return original(backend, *args, **kwargs)

    setattr(c10d, "init_process_group", init_process_group)


def _cuda_missing(exc: BaseException, tb: Any) -> str | None:
    """The first line of ``exc`` when it comes from asking for CUDA where there is none."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch.cuda.is_available():
            return None
    except Exception:  # noqa: BLE001 - a broken CUDA set-up is still "no usable GPU"
        pass
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if any(marker.lower() in first.lower() for marker in CUDA_MISSING):
        return first
    while tb is not None:  # raised inside torch.cuda (a CPU-only build has no CUDA bindings)
        if frames.in_package(tb.tb_frame.f_code.co_filename, "torch", "cuda"):
            return first
        tb = tb.tb_next
    return None


def install_cuda_missing_hook(rank: str) -> None:
    """Turn a CUDA-missing crash into one line and the hint to use ``--cpu``."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        first = _cuda_missing(exc, tb)
        if first is None:
            previous(kind, exc, tb)
            return
        print(f"scaletrain: rank {rank}: this program needs a CUDA GPU and this machine has "
              f"none ({kind.__name__}: {first})\nHINT: smoke-test it on CPU processes with "
              "'scaletrain run --cpu ...', or run it where GPUs are allocated", file=sys.stderr)

    sys.excepthook = hook
