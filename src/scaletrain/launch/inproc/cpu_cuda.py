"""``scaletrain run --cpu``: the CUDA and accelerator API a GPU program calls, answered on the CPU.

A program written for one GPU per process asks torch about its device before it computes:
``torch.cuda.is_available()``, ``device_count()``, ``set_device(local_rank)``, streams and
events, ``torch.accelerator.current_accelerator()``. On a CPU-only machine each of those fails
or says "no". Here they answer as a node with one GPU per worker would, with work that a GPU
would run asynchronously done at once on the CPU: a stream is a context that changes nothing,
an event is a CPU clock reading, ``synchronize`` returns. Nothing here imports torch itself;
:func:`patch_cuda` and :func:`patch_accelerator` get the imported module.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from types import ModuleType, SimpleNamespace
from typing import Any

from scaletrain import module_state

_LOCAL = threading.local()  # set_device is per thread on a GPU too


def workers_per_node() -> int:
    """The GPUs a node of this run would have: one per worker on it."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def device_index(device: Any) -> int:
    """The index in ``0``, ``"cuda:1"``, ``torch.device("cuda", 1)``; 0 when it names none."""
    if isinstance(device, bool):
        return 0
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if isinstance(index, int):
        return index
    text = str(device) if device is not None else ""
    tail = text.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def current_index() -> int:
    """The device this thread last set (``torch.cuda.set_device``), else 0."""
    return int(getattr(_LOCAL, "index", 0))


def set_index(device: Any) -> None:
    """``torch.cuda.set_device`` / ``torch.accelerator.set_device_index``."""
    _LOCAL.index = device_index(device)


class Event:
    """torch.cuda.Event on the CPU clock: record/synchronize/elapsed_time in milliseconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.t = time.perf_counter()

    def record(self, *args: Any) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def wait(self, *args: Any) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Event) -> float:
        return (end.t - self.t) * 1000.0


class Stream:
    """torch.cuda.Stream on the CPU: work runs when it is issued, so every wait is done."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device_index = device_index(device) if device is not None else current_index()
        self.priority = priority
        self.cuda_stream = 0
        self.stream_id = 0
        self.device_type = 1  # what torch.Stream reports for CUDA

    @property
    def device(self) -> Any:
        import torch

        return torch.device("cuda", self.device_index)

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Event:
        event = event if event is not None else Event()
        event.record()
        return event

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:  # no CUDA graph is ever being recorded
        return False

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.device_index == self.device_index

    def __hash__(self) -> int:
        return hash(("scaletrain-cpu-stream", self.device_index))


_DEFAULT_STREAMS: dict[int, Stream] = {}
module_state.register(__name__, "_DEFAULT_STREAMS")


def _default_stream(device: Any = None) -> Stream:
    index = device_index(device) if device is not None else current_index()
    return _DEFAULT_STREAMS.setdefault(index, Stream(index))


def _device_context(device: Any = None) -> contextlib.AbstractContextManager[None]:
    """``with torch.cuda.device(i):`` sets the device for the block, as on a GPU."""

    @contextlib.contextmanager
    def scope() -> Any:
        before = current_index()
        if device is not None and device != -1:
            set_index(device)
        try:
            yield
        finally:
            set_index(before)

    return scope()


def _properties() -> SimpleNamespace:
    pages = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return SimpleNamespace(name="CPU (scaletrain run --cpu)", major=8, minor=0,
                           total_memory=pages, multi_processor_count=os.cpu_count() or 1,
                           is_integrated=False, uuid="scaletrain-cpu")


def patch_cuda(torch: ModuleType) -> None:
    """Make ``torch.cuda`` answer as one GPU per worker, on the CPU."""
    cuda = torch.cuda
    per_node = workers_per_node()
    props = _properties()
    values: dict[str, Any] = {
        "is_available": lambda: True, "device_count": lambda: per_node,
        "set_device": set_index, "current_device": current_index,
        "device": _device_context, "device_of": lambda *a, **k: contextlib.nullcontext(),
        "get_device_name": lambda *a: props.name, "get_device_capability": lambda *a: (8, 0),
        "get_device_properties": lambda *a: props, "is_bf16_supported": lambda *a, **k: True,
        "Event": Event, "Stream": Stream, "ExternalStream": Stream,
        "stream": lambda stream=None: contextlib.nullcontext(stream),
        "current_stream": _default_stream, "default_stream": _default_stream,
        "set_stream": lambda *a, **k: None, "is_initialized": lambda: True,
        "mem_get_info": lambda *a: (props.total_memory, props.total_memory),
        "memory_stats": lambda *a, **k: {}, "memory_summary": lambda *a, **k: "",
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "get_rng_state_all": lambda: [torch.get_rng_state()] * per_node,
        "set_rng_state": lambda *a, **k: None, "set_rng_state_all": lambda *a, **k: None,
        "initial_seed": lambda: torch.initial_seed(),
    }
    for name in ("synchronize", "empty_cache", "manual_seed", "manual_seed_all", "seed",
                 "seed_all", "init", "reset_peak_memory_stats", "reset_max_memory_allocated",
                 "reset_accumulated_memory_stats", "ipc_collect", "set_per_process_memory_fraction"):
        values[name] = lambda *a, **k: None
    for name in ("utilization", "temperature", "power_draw", "clock_rate"):
        values[name] = lambda *a, **k: 0
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "memory_cached", "max_memory_cached"):
        values[name] = lambda *a, **k: 0
    for kind in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte",
                 "Bool"):  # the legacy typed constructors: their CPU twins
        values[f"{kind}Tensor"] = getattr(torch, f"{kind}Tensor")
    for name, value in values.items():
        setattr(cuda, name, value)
    _patch_tools(cuda)
    for sub in ("memory", "random", "streams"):  # `from torch.cuda.memory import ...` too
        module = getattr(cuda, sub, None)
        for name, value in values.items():
            if module is not None and hasattr(module, name):
                setattr(module, name, value)


def _patch_tools(cuda: ModuleType) -> None:
    """Profiler marks and memory history: nothing to mark or record on the CPU."""
    nvtx = getattr(cuda, "nvtx", None)
    if nvtx is not None:
        for name in ("range_push", "range_pop", "mark", "range_start", "range_end"):
            setattr(nvtx, name, lambda *a, **k: 0)
        setattr(nvtx, "range", lambda *a, **k: contextlib.nullcontext())
    memory = getattr(cuda, "memory", None)
    if memory is not None:
        for name in ("_record_memory_history", "_dump_snapshot"):
            setattr(memory, name, lambda *a, **k: None)
        setattr(memory, "_snapshot", lambda *a, **k: {"segments": [], "device_traces": []})


def patch_accelerator(torch: ModuleType) -> None:
    """``torch.accelerator`` names CUDA, as on a GPU node, and its calls go to the fake above."""
    acc = getattr(torch, "accelerator", None)
    if acc is None:
        return
    per_node = workers_per_node()
    values: dict[str, Any] = {
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "is_available": lambda: True, "device_count": lambda: per_node,
        "current_device_index": current_index, "current_device_idx": current_index,
        "set_device_index": set_index, "set_device_idx": set_index,
        "current_stream": _default_stream, "set_stream": lambda *a, **k: None,
        "synchronize": lambda *a, **k: None,
        "get_device_capability": lambda *a: {"major": 8, "minor": 0},
        "device_index": _device_context,
    }
    for name, value in values.items():
        setattr(acc, name, value)
    memory = getattr(acc, "memory", None)
    if memory is not None:
        for name in ("empty_cache", "reset_peak_memory_stats", "reset_accumulated_memory_stats"):
            if hasattr(memory, name):
                setattr(memory, name, lambda *a, **k: None)
