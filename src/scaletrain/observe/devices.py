"""GPU utilisation, memory and power, sampled by a background thread off the step path.

Backends, tried in order for the vendor in use:

- NVIDIA: NVML through ``nvidia-ml-py`` (the ``monitor`` extra);
- AMD: ``amdsmi`` (ROCm 6), else the ``rocm-smi`` command.

Where none works (no GPU, no library, a driver that refuses) the sampler is *unavailable* with a
one-line reason; nothing raises. The Monitor asks :meth:`DeviceSampler.snapshot` every few
steps for the averages since the previous snapshot.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One reading of one device."""

    util_pct: float | None = None      # busy time of the device in the last sample period
    mem_gb: float | None = None        # memory in use on the device (all processes)
    power_w: float | None = None


class Backend(Protocol):
    """A source of samples for one device."""

    name: str

    def read(self) -> Sample: ...

    def close(self) -> None: ...


class NvmlBackend:
    """NVIDIA devices through NVML (``pip install nvidia-ml-py``)."""

    name = "nvml"

    def __init__(self, index: int) -> None:
        import pynvml  # nvidia-ml-py

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def read(self) -> Sample:
        n = self._nvml
        util = n.nvmlDeviceGetUtilizationRates(self._handle).gpu
        mem = n.nvmlDeviceGetMemoryInfo(self._handle).used / 1024 ** 3
        try:
            power = n.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
        except n.NVMLError:
            power = None
        return Sample(util_pct=float(util), mem_gb=mem, power_w=power)

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a library that may already be gone
            pass


class AmdSmiBackend:
    """AMD devices through the ``amdsmi`` Python package (ROCm 6)."""

    name = "amdsmi"

    def __init__(self, index: int) -> None:
        import amdsmi

        self._smi = amdsmi
        amdsmi.amdsmi_init()
        self._handle = amdsmi.amdsmi_get_processor_handles()[index]

    def read(self) -> Sample:
        s = self._smi
        act = s.amdsmi_get_gpu_activity(self._handle)
        vram = s.amdsmi_get_gpu_vram_usage(self._handle)
        try:
            power = float(s.amdsmi_get_power_info(self._handle).get("average_socket_power", 0))
        except Exception:  # noqa: BLE001 - not every GPU/driver reports power
            power = None
        return Sample(util_pct=float(act.get("gfx_activity", 0)), mem_gb=float(vram.get("vram_used", 0)) / 1024,
                      power_w=power)

    def close(self) -> None:
        try:
            self._smi.amdsmi_shut_down()
        except Exception:  # noqa: BLE001
            pass


class RocmSmiBackend:
    """AMD devices through the ``rocm-smi --json`` command (older ROCm)."""

    name = "rocm-smi"

    def __init__(self, index: int) -> None:
        self._exe = shutil.which("rocm-smi")
        if not self._exe:
            raise FileNotFoundError("rocm-smi not on PATH")
        self._index = index
        self.read()  # fail now, not in the thread, when it does not work

    def read(self) -> Sample:
        assert self._exe is not None  # available() found rocm-smi
        out = subprocess.run([self._exe, "-d", str(self._index), "--showuse", "--showmemuse",
                              "--showpower", "--json"], capture_output=True, text=True, timeout=10)
        card = next(iter(json.loads(out.stdout).values()))

        def num(*keys: str) -> float | None:
            for k, v in card.items():
                if any(key.lower() in k.lower() for key in keys):
                    try:
                        return float(str(v).split()[0])
                    except ValueError:
                        return None
            return None

        return Sample(util_pct=num("GPU use"), mem_gb=None, power_w=num("Power"))

    def close(self) -> None:
        pass


def open_backend(vendor: str, index: int) -> tuple[Backend | None, str]:
    """The first backend that works for ``vendor`` ("nvidia"/"amd") and device ``index``.

    Returns ``(backend, "")`` or ``(None, reason)``; never raises.
    """
    makers: list[tuple[str, Callable[[int], Any]]] = []
    if vendor == "nvidia":
        makers = [("nvidia-ml-py (pip install 'scaletrain[monitor]')", NvmlBackend)]
    elif vendor == "amd":
        makers = [("amdsmi", AmdSmiBackend), ("rocm-smi", RocmSmiBackend)]
    else:
        return None, "no GPU: the device is the CPU"
    reasons = []
    for label, make in makers:
        try:
            return make(index), ""
        except ImportError:
            reasons.append(f"{label} not installed")
        except Exception as exc:  # noqa: BLE001 - a missing driver raises library-specific errors
            reasons.append(f"{label}: {type(exc).__name__}: {exc}".strip())
    return None, "; ".join(reasons)


class DeviceSampler:
    """Reads one device every ``interval_s`` seconds in a daemon thread.

    ``snapshot()`` returns the means since the previous snapshot as a dict with
    ``available`` and, when available, ``util_pct``, ``mem_gb``, ``power_w``, ``samples``;
    when unavailable, ``reason``.
    """

    def __init__(self, backend: Backend | None, *, reason: str = "", interval_s: float = 2.0) -> None:
        self._backend = backend
        self.reason = reason
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._all: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if backend is not None:
            self._thread = threading.Thread(target=self._loop, name="scaletrain-device-sampler", daemon=True)
            self._thread.start()

    @property
    def available(self) -> bool:
        return self._backend is not None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self._backend.read()  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - a driver error ends sampling, not training
                self.reason = f"sampling stopped: {type(exc).__name__}: {exc}"
                self._backend = None
                return
            with self._lock:
                self._samples.append(sample)
                self._all.append(sample)
                del self._all[:-10_000]  # bounded: hours of samples at most
            self._stop.wait(self.interval_s)

    @staticmethod
    def _mean(samples: list[Sample]) -> dict[str, Any]:
        out: dict[str, Any] = {"available": True, "samples": len(samples)}
        for field in ("util_pct", "mem_gb", "power_w"):
            values = [getattr(s, field) for s in samples if getattr(s, field) is not None]
            out[field] = sum(values) / len(values) if values else None
        return out

    def snapshot(self) -> dict[str, Any]:
        """Means since the last snapshot (``samples`` = 0 when none arrived yet)."""
        if self._backend is None and not self._samples:
            return {"available": False, "reason": self.reason}
        with self._lock:
            samples, self._samples = self._samples, []
        return self._mean(samples)

    def overall(self) -> dict[str, Any]:
        """Means over the whole run."""
        with self._lock:
            samples = list(self._all)
        if not samples:
            return {"available": False, "reason": self.reason or "no samples taken"}
        return self._mean(samples)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._backend is not None:
            self._backend.close()


def sampler_for_device(device: str, *, vendor: str | None = None, interval_s: float = 2.0,
                       environ: Any = None) -> DeviceSampler:
    """A sampler for this process's device (``cuda:N``); unavailable on the CPU."""
    import os

    if not device.startswith("cuda"):
        return DeviceSampler(None, reason="no GPU: the device is the CPU", interval_s=interval_s)
    from scaletrain.runtime.device import physical_gpu

    environ = os.environ if environ is None else environ
    index = physical_gpu(device, environ)
    if index is None:
        index = int(device.split(":", 1)[1]) if ":" in device else 0
    if vendor is None:
        import torch

        vendor = "amd" if getattr(torch.version, "hip", None) else "nvidia"
    backend, reason = open_backend(vendor, index)
    return DeviceSampler(backend, reason=reason, interval_s=interval_s)
