"""GPU utilisation, memory and power of a node's devices, sampled by one thread per node.

Backends, tried in order for the vendor in use, each reading every device of the node:

- NVIDIA: NVML through ``nvidia-ml-py`` (the ``monitor`` extra);
- AMD: ``amdsmi`` (ROCm 6), else the ``rocm-smi`` command.

One process per node samples (the lowest local rank, see :func:`samples_here`): the others
start no thread and open no library. Devices are named by their node-level index as a string
(``"0"``, ``"3"``), the number NVML/AMD SMI and ``CUDA_VISIBLE_DEVICES`` use; an NVIDIA UUID is
accepted as an alias. Each rank names its own device with :func:`device_key`, and the Monitor's
cross-rank exchange carries the sampling rank's figures to the others
(:func:`scaletrain.observe.health.attach_samples`).

Where no backend works (no GPU, no library, a driver that refuses) the sampler is
*unavailable* with a one-line reason; nothing raises.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from scaletrain.extras import install_hint
from scaletrain.jsonfile import loads as json_loads


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One reading of one device."""

    util_pct: float | None = None      # busy time of the device in the last sample period
    mem_gb: float | None = None        # memory in use on the device (all processes)
    power_w: float | None = None


FIELDS = ("util_pct", "mem_gb", "power_w")
THREAD_NAME = "scaletrain-device-sampler"


class Backend(Protocol):
    """A source of samples for every device of the node, keyed by device id (``"0"``, ``"1"``...)."""

    name: str

    def read(self) -> dict[str, Sample]: ...

    def close(self) -> None: ...


class NvmlBackend:
    """NVIDIA devices through NVML (``pip install nvidia-ml-py``): every GPU NVML sees."""

    name = "nvml"

    def __init__(self) -> None:
        import pynvml  # nvidia-ml-py

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handles = {str(i): pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())}
        self.aliases: dict[str, str] = {}  # UUID -> index, for CUDA_VISIBLE_DEVICES=GPU-...
        for key, handle in self._handles.items():
            try:
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                self.aliases[uuid.decode() if isinstance(uuid, bytes) else str(uuid)] = key
            except pynvml.NVMLError:
                pass

    def _read_one(self, handle: Any) -> Sample:
        n = self._nvml
        try:
            util = float(n.nvmlDeviceGetUtilizationRates(handle).gpu)
            mem = n.nvmlDeviceGetMemoryInfo(handle).used / 1024 ** 3
        except n.NVMLError:  # e.g. a GPU of the node outside this job's cgroup
            return Sample()
        try:
            power = n.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except n.NVMLError:
            power = None
        return Sample(util_pct=util, mem_gb=mem, power_w=power)

    def read(self) -> dict[str, Sample]:
        return {key: self._read_one(handle) for key, handle in self._handles.items()}

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a library that may already be gone
            pass


class AmdSmiBackend:
    """AMD devices through the ``amdsmi`` Python package (ROCm 6): every GPU (GCD) it lists."""

    name = "amdsmi"

    def __init__(self) -> None:
        import amdsmi

        self._smi = amdsmi
        amdsmi.amdsmi_init()
        self._handles = {str(i): h for i, h in enumerate(amdsmi.amdsmi_get_processor_handles())}

    def _read_one(self, handle: Any) -> Sample:
        s = self._smi
        act = s.amdsmi_get_gpu_activity(handle)
        vram = s.amdsmi_get_gpu_vram_usage(handle)
        try:
            power: float | None = float(s.amdsmi_get_power_info(handle).get("average_socket_power", 0))
        except Exception:  # noqa: BLE001 - not every GPU/driver reports power
            power = None
        return Sample(util_pct=float(act.get("gfx_activity", 0)), mem_gb=float(vram.get("vram_used", 0)) / 1024,
                      power_w=power)

    def read(self) -> dict[str, Sample]:
        return {key: self._read_one(handle) for key, handle in self._handles.items()}

    def close(self) -> None:
        try:
            self._smi.amdsmi_shut_down()
        except Exception:  # noqa: BLE001
            pass


class RocmSmiBackend:
    """AMD devices through the ``rocm-smi --json`` command (older ROCm): every card it reports."""

    name = "rocm-smi"

    def __init__(self) -> None:
        self._exe = shutil.which("rocm-smi")
        if not self._exe:
            raise FileNotFoundError("rocm-smi not on PATH")

    def read(self) -> dict[str, Sample]:
        assert self._exe is not None  # __init__ found rocm-smi
        out = subprocess.run([self._exe, "--showuse", "--showmemuse", "--showpower", "--json"],
                             capture_output=True, text=True, timeout=10)
        cards = json_loads(out.stdout)

        def num(card: dict[str, Any], *keys: str) -> float | None:
            for k, v in card.items():
                if any(key.lower() in k.lower() for key in keys):
                    try:
                        return float(str(v).split()[0])
                    except ValueError:
                        return None
            return None

        return {name[4:]: Sample(util_pct=num(card, "GPU use"), power_w=num(card, "Power"))
                for name, card in cards.items() if name.startswith("card") and isinstance(card, dict)}

    def close(self) -> None:
        pass


def open_backend(vendor: str) -> tuple[Backend | None, str]:
    """The first backend that works for ``vendor`` ("nvidia"/"amd") on this node.

    Returns ``(backend, "")`` or ``(None, reason)``; never raises.
    """
    makers: list[tuple[str, Callable[[], Any]]] = []
    if vendor == "nvidia":
        makers = [(f"nvidia-ml-py ({install_hint('monitor', 'nvidia-ml-py')})", NvmlBackend)]
    elif vendor == "amd":
        makers = [("amdsmi", AmdSmiBackend), ("rocm-smi", RocmSmiBackend)]
    else:
        return None, "no GPU: the device is the CPU"
    reasons = []
    for label, make in makers:
        try:
            return make(), ""
        except ImportError:
            reasons.append(f"{label} not installed")
        except Exception as exc:  # noqa: BLE001 - a missing driver raises library-specific errors
            reasons.append(f"{label}: {type(exc).__name__}: {exc}".strip())
    return None, "; ".join(reasons)


class _Means:
    """Running sums of one device's readings (bounded memory however long the run)."""

    __slots__ = ("count", "sums", "counts", "last")

    def __init__(self) -> None:
        self.count = 0
        self.sums = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self.last: Sample | None = None

    def add(self, sample: Sample, *, count: bool = True) -> None:
        self.last = sample
        if not count:
            return
        self.count += 1
        for i, field in enumerate(FIELDS):
            value = getattr(sample, field)
            if value is not None:
                self.sums[i] += value
                self.counts[i] += 1

    def figures(self) -> dict[str, Any]:
        if not self.count and self.last is not None:  # nothing new since the last snapshot: the latest
            return {"samples": 0, **{f: getattr(self.last, f) for f in FIELDS}}
        return {"samples": self.count,
                **{f: self.sums[i] / self.counts[i] if self.counts[i] else None for i, f in enumerate(FIELDS)}}


class DeviceSampler:
    """Reads every device of the node every ``interval_s`` seconds in a daemon thread.

    The first reading is taken in the constructor, so a backend that does not work is
    unavailable at once (no thread) and the first snapshot has figures; it is only a probe,
    taken before the training, so it counts in no mean (a window without a later reading has
    ``samples`` 0, which :func:`scaletrain.observe.health.attach_samples` ignores).
    :meth:`snapshot` returns ``{"available": True, "devices": {id: figures}}`` with the means
    since the previous snapshot (figures: ``util_pct``, ``mem_gb``, ``power_w``, ``samples``;
    with no reading since, the latest one and ``samples`` 0), plus ``aliases`` (UUID -> id)
    where the backend has them; when unavailable, ``{"available": False, "reason": ...}``.
    """

    def __init__(self, backend: Backend | None, *, reason: str = "", interval_s: float = 2.0) -> None:
        self._backend = backend
        self.reason = reason
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._window: dict[str, _Means] = {}
        self._run: dict[str, _Means] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.aliases: dict[str, str] = dict(getattr(backend, "aliases", None) or {})
        if backend is not None and self._read(probe=True):
            self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
            self._thread.start()

    @property
    def available(self) -> bool:
        return self._backend is not None

    def _read(self, *, probe: bool = False) -> bool:
        """One reading of every device (a ``probe`` counts in no mean); False (and unavailable)
        when the backend fails."""
        try:
            readings = self._backend.read()  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - a driver error ends sampling, not training
            self.reason = f"sampling stopped: {type(exc).__name__}: {exc}"
            backend, self._backend = self._backend, None
            try:
                backend.close()  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001
                pass
            return False
        with self._lock:
            for key, sample in readings.items():
                self._window.setdefault(key, _Means()).add(sample, count=not probe)
                self._run.setdefault(key, _Means()).add(sample, count=not probe)
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s) and self._read():
            pass

    def _figures(self, table: dict[str, _Means]) -> dict[str, Any]:
        out: dict[str, Any] = {"available": True, "devices": {k: m.figures() for k, m in table.items()}}
        if self.aliases:
            out["aliases"] = self.aliases
        return out

    def snapshot(self) -> dict[str, Any]:
        """Per-device means since the last snapshot (see the class docstring)."""
        with self._lock:
            if self._backend is None or not self._window:  # never worked, or stopped since
                return {"available": False, "reason": self.reason or "no samples taken"}
            out = self._figures(self._window)
            for means in self._window.values():  # a new window, keeping each device's latest reading
                means.count, means.sums, means.counts = 0, [0.0, 0.0, 0.0], [0, 0, 0]
        return out

    def overall(self) -> dict[str, Any]:
        """Per-device means over the whole run."""
        with self._lock:
            if not self._run:
                return {"available": False, "reason": self.reason or "no samples taken"}
            return self._figures(self._run)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._backend is not None:
            self._backend.close()
            self._backend = None



def samples_here(local_rank: int) -> bool:
    """Whether this process runs its node's sampler: only the lowest local rank does."""
    return local_rank == 0


def device_key(device: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The node-level id of ``device`` as the samplers name it, or None for the CPU.

    ``cuda:1`` with ``CUDA_VISIBLE_DEVICES=2,3`` is ``"3"``; with a UUID list, the UUID
    (which NVML's aliases map to an index); without a visible list, the torch index.
    """
    import os

    from scaletrain.runtime.device import VISIBLE_VARS, parse_visible, physical_gpu

    if not device.startswith("cuda"):
        return None
    environ = os.environ if environ is None else environ
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    physical = physical_gpu(f"cuda:{index}", environ)
    if physical is not None:
        return str(physical)
    for name in VISIBLE_VARS:
        if name in environ:
            ids = parse_visible(environ[name])
            if index < len(ids):
                return ids[index]
    return str(index)


def lookup(figures: dict[str, Any] | None, key: str | None) -> dict[str, Any]:
    """One device's figures from a sampler's snapshot or overall (or why there are none)."""
    if figures is None:
        return {"available": False, "reason": "no sampler on this node"}
    if not figures.get("available"):
        return {"available": False, "reason": figures.get("reason", "unavailable")}
    if key is None:
        return {"available": False, "reason": "no GPU: the device is the CPU"}
    devices = figures.get("devices", {})
    key = figures.get("aliases", {}).get(key, key)
    if key not in devices:
        return {"available": False,
                "reason": f"device {key} is not among the {len(devices)} sampled on this node ({', '.join(devices)})"}
    return {"available": True, "device": key, **devices[key]}


def node_sampler(device: str, *, vendor: str | None = None, interval_s: float = 2.0) -> DeviceSampler:
    """The sampler for every device of this node (call it on the sampling rank only).

    Unavailable, without a thread, on the CPU or where no backend works.
    """
    if not device.startswith("cuda"):
        return DeviceSampler(None, reason="no GPU: the device is the CPU", interval_s=interval_s)
    if vendor is None:
        import torch

        vendor = "amd" if getattr(torch.version, "hip", None) else "nvidia"
    backend, reason = open_backend(vendor)
    return DeviceSampler(backend, reason=reason, interval_s=interval_s)


def rank_sampler(spec: Any, device: str, env: Any, *, interval_s: float) -> tuple[str, DeviceSampler | None]:
    """This rank's part in sampling its node, as a Monitor's ``device_sampler`` asks: ("off",
    None) for None; ("remote", None) on a rank that is not its node's lowest (that rank reports
    this device); else ("here", the node's sampler: ``node_sampler`` for "auto", or one reading
    the given backend)."""
    if spec is None:
        return "off", None
    if not samples_here(env.local_rank if env is not None else 0):
        return "remote", None
    if spec == "auto":
        return "here", node_sampler(device, interval_s=interval_s)
    return "here", DeviceSampler(spec, interval_s=interval_s)


def device_peak_flops(device: str) -> float | None:
    """The datasheet peak FLOP/s of ``device`` (a CUDA/ROCm GPU), None elsewhere or unknown."""
    if not device.startswith("cuda"):
        return None
    import torch

    from scaletrain.observe.flops import peak_flops

    return peak_flops(torch.cuda.get_device_name(torch.device(device)))


def peak_memory_gb(device: str) -> float:
    """Peak memory so far: the device's max allocated on a GPU, the process's peak RSS elsewhere."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated(device) / 1024 ** 3
    import resource
    import sys

    # ru_maxrss is in KiB on Linux (bytes on macOS)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 ** 3 if sys.platform == "darwin" else 1024 ** 2)
