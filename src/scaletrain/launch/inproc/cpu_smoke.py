"""``scaletrain run --cpu``: smoke-test a program written for CUDA and NCCL on CPU processes.

Inside the workers of that run only (the worker shim applies it when the program imports
torch), and loudly (the launcher says so at the start and the end):

- ``init_process_group(backend="nccl")`` uses gloo; its ``device_id`` and NCCL options are dropped,
  and ``is_nccl_available()`` says True (a program, or ``scaletrain.init()``, that picks NCCL gets gloo);
- every CUDA placement stays on, or maps to, the CPU: ``.cuda()``, ``.cuda(rank)``,
  ``.to("cuda")``, ``.to(local_rank)`` (an integer is a GPU index), ``torch.device(rank)``,
  ``device="cuda"`` in factory functions, ``torch.load(map_location="cuda:0")``, in every thread
  the program starts (data-loader pin-memory threads, prefetchers) as well as the main one;
- ``torch.cuda`` and ``torch.accelerator`` answer as a node with one GPU per worker
  (:mod:`cpu_cuda`): streams and events are no-ops, ``synchronize`` returns;
- a ``DeviceMesh("cuda", ...)`` (FSDP2, tensor parallel) is a CPU mesh over gloo;
- ``DistributedDataParallel(device_ids=[...], output_device=...)`` drops the device lists;
- ``os.sched_setaffinity`` to cores this machine lacks keeps the cores it has (said once).

What cannot be mapped raises one line naming the construct (:data:`UNSUPPORTED`).
Without ``--cpu`` on a machine with no GPU, a CUDA-only program fails with one line and the
hint to use ``--cpu`` instead of a CUDA traceback (:func:`install_cuda_missing_hook`).
"""

from __future__ import annotations

import functools
import os
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

from scaletrain.contract.environ import CPU_SMOKE_VAR
from scaletrain.launch import frames
from scaletrain.launch.inproc import cpu_cuda, cpu_map

BANNER = ("CPU smoke test (--cpu): CUDA calls run on CPU processes and NCCL is gloo; "
          "it checks that the program runs and its ranks agree, not its speed or GPU numbers")

# First lines of the errors a CUDA-only program raises where there is no GPU.
CUDA_MISSING = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver",
                "No CUDA GPUs are available", "doesn't have NCCL built in",
                "Attempting to deserialize object on a CUDA device",
                "ProcessGroupNCCL is only supported with GPUs", "CUDA driver initialization failed",
                "Cannot access accelerator device when none is available",
                # a CUDA extension built at run time (DeepSpeed's fused ops, torch's cpp_extension)
                "CUDA_HOME environment variable is not set", "CUDA_HOME does not exist")


# What --cpu cannot run, each with the reason shown in its one-line error.
UNSUPPORTED: dict[str, str] = {
    "torch.cuda.CUDAGraph": "CUDA graphs replay recorded GPU kernels; the CPU has none to replay",
    "torch.cuda.graph": "CUDA graphs replay recorded GPU kernels; the CPU has none to replay",
    "torch.cuda.make_graphed_callables": "CUDA graphs replay recorded GPU kernels; the CPU has "
                                         "none to replay",
    "torch.cuda.graph_pool_handle": "CUDA graphs replay recorded GPU kernels; the CPU has none "
                                    "to replay",
    "torch.cuda.jiterator": "it compiles CUDA source at run time",
}
UNSUPPORTED_HINT = ("run this part on a GPU node, or guard it with "
                    f"'if os.environ.get(\"{CPU_SMOKE_VAR}\") != \"1\"'")


def unsupported_error(name: str) -> Exception:
    """The one-line error for construct ``name`` (a ScaletrainError the worker renders)."""
    from scaletrain.errors import UsageError  # imported late: the worker's own class

    return UsageError(f"--cpu cannot run {name}: {UNSUPPORTED[name]}", UNSUPPORTED_HINT)


def _refuse(name: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise unsupported_error(name)

    return refuse


def _patch_unsupported(torch: ModuleType) -> None:
    for name in UNSUPPORTED:
        attr = name.rsplit(".", 1)[1]
        if attr == "jiterator":
            setattr(torch.cuda, attr, SimpleNamespace(
                _create_jit_fn=_refuse(name), _create_multi_output_jit_fn=_refuse(name)))
        else:
            setattr(torch.cuda, attr, _refuse(name))


def _describe_affinity(cores: set[int]) -> str:
    from scaletrain.contract.environ import format_cores

    return format_cores(sorted(cores))


def clip_affinity(notify: Any = None) -> None:
    """``os.sched_setaffinity`` to cores this machine lacks keeps those it has, said once.

    A program written for a centre's node pins itself to that node's core list (``range(32,
    64)`` for the second of two tasks); on a smaller machine the kernel refuses it (EINVAL).
    """
    original = getattr(os, "sched_setaffinity", None)
    if original is None or getattr(original, "_scaletrain_cpu", False):
        return
    said: list[bool] = []

    def sched_setaffinity(pid: int, mask: Any) -> None:
        wanted = {int(c) for c in mask}
        have = set(os.sched_getaffinity(0))
        online = set(range(os.cpu_count() or 1))
        if wanted <= online:
            original(pid, wanted)
            return
        kept = (wanted & online) or have
        if not said:
            said.append(True)
            print(f"scaletrain: --cpu: os.sched_setaffinity asked for cores "
                  f"{_describe_affinity(wanted)}, this machine has "
                  f"{_describe_affinity(online)}: using {_describe_affinity(kept)}",
                  file=sys.stderr, flush=True)
        original(pid, kept)

    setattr(sched_setaffinity, "_scaletrain_cpu", True)
    setattr(os, "sched_setaffinity", sched_setaffinity)


def patch_torch(torch: ModuleType) -> None:
    """Apply the CPU mapping to an imported torch (the hook on ``import torch``)."""
    cpu_cuda.patch_cuda(torch)
    cpu_cuda.patch_accelerator(torch)
    _patch_unsupported(torch)
    cpu_map.patch_device(torch)
    cpu_map.patch_module(torch)
    cpu_map.patch_load(torch)
    cpu_map.patch_ddp(torch)
    cpu_map.attribute_warnings()
    mode_cls = cpu_map.cpu_mode(torch)
    mode_cls().__enter__()  # for the life of the process, like torch.set_default_device
    cpu_map.cover_threads(mode_cls)


def patch_device_mesh(mesh_module: ModuleType) -> None:
    """The hook on ``torch.distributed.device_mesh``: CUDA meshes are CPU meshes."""
    cpu_map.patch_device_mesh(mesh_module)


def patch_c10d(c10d: ModuleType) -> None:
    """``init_process_group``/``new_group``: NCCL (or a "cuda:nccl" pair) becomes gloo; the
    NCCL-only ``device_id`` and ``pg_options`` are dropped."""
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
            kwargs.pop("pg_options", None)
        return original(backend, *args, **kwargs)

    original_new = getattr(c10d, "new_group")

    @functools.wraps(original_new)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        if "nccl" in str(kwargs.get("backend", "")).lower():
            kwargs["backend"] = "gloo"
            kwargs.pop("pg_options", None)
        kwargs.pop("device_id", None)
        return original_new(*args, **kwargs)

    def is_nccl_available() -> bool:
        """A group asked for NCCL is a gloo group here: a program (or scaletrain.init()) that
        chooses NCCL where it is available gets it, as on the GPU node it was written for."""
        return True

    setattr(c10d, "init_process_group", init_process_group)
    setattr(c10d, "new_group", new_group)
    setattr(c10d, "is_nccl_available", is_nccl_available)   # torch.distributed takes it by its import *


def _cuda_missing(exc: BaseException, tb: Any, *, mapped: bool = False) -> str | None:
    """The first line of ``exc`` when it comes from asking for CUDA where there is none.

    ``mapped``: under ``--cpu``, where ``torch.cuda.is_available()`` says True on purpose.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch.cuda.is_available() and not mapped:
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


def _program_line(tb: Any) -> str:
    """``FILE:LINE`` of the innermost frame of the program itself (not torch, not ours)."""
    import traceback

    for frame in reversed(traceback.extract_tb(tb)):
        name = frame.filename.replace(os.sep, "/")
        if "/torch/" not in name and "/scaletrain/" not in name and not name.startswith("<"):
            return f"{frames.short_path(frame.filename)}:{frame.lineno}"
    return "an unknown place"


def install_cuda_missing_hook(rank: str, *, mapped: bool = False) -> None:
    """Turn a CUDA-missing crash into one line: the hint to use ``--cpu`` or, under ``--cpu``
    (``mapped``), the place of the call that it could not map."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        first = _cuda_missing(exc, tb, mapped=mapped)
        if first is None:
            previous(kind, exc, tb)
            return
        if mapped:
            print(f"scaletrain: rank {rank}: --cpu could not map the CUDA call at "
                  f"{_program_line(tb)} to the CPU ({kind.__name__}: {first})\nHINT: run this "
                  "part on a GPU node; docs/bring-your-script.md lists what --cpu maps",
                  file=sys.stderr)
            return
        print(f"scaletrain: rank {rank}: this program needs a CUDA GPU and this machine has "
              f"none ({kind.__name__}: {first})\nHINT: smoke-test it on CPU processes with "
              "'scaletrain run --cpu ...', or run it where GPUs are allocated", file=sys.stderr)

    sys.excepthook = hook
