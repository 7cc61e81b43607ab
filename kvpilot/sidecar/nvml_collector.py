"""GPU memory, utilisation, power and temperature from NVML (nvidia-ml-py), read at each scrape."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from prometheus_client.core import Metric

from kvpilot.sidecar.readings import Readings, build_families
from kvpilot.sidecar.schema import GPU

log = logging.getLogger("kvpilot.sidecar")

# schema name -> how to read it from (nvml module, device handle)
GPU_FIELDS: dict[str, Callable[[Any, Any], float]] = {
    "kvpilot_gpu_memory_used_bytes": lambda nvml, h: float(nvml.nvmlDeviceGetMemoryInfo(h).used),
    "kvpilot_gpu_memory_total_bytes": lambda nvml, h: float(nvml.nvmlDeviceGetMemoryInfo(h).total),
    "kvpilot_gpu_utilization_ratio": lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
    "kvpilot_gpu_power_watts": lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
    "kvpilot_gpu_temperature_celsius": lambda nvml, h: float(
        nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
    ),
}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlCollector:
    """Per-GPU families labelled `gpu` (index) and `uuid`; without NVML only `kvpilot_gpu_available 0`."""

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self.nvml: Any = None
        self._logged: set[str] = set()
        self._lock = threading.Lock()
        try:
            if nvml is None:
                import pynvml as nvml  # nvidia-ml-py
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError, ...
            self._log_once("init", "no GPU metrics: NVML unavailable (%s: %s); exporting kvpilot_gpu_available 0",
                           type(exc).__name__, exc)
            return
        if count == 0:
            self._log_once("init", "no GPU metrics: NVML reports 0 GPUs; exporting kvpilot_gpu_available 0")
            return
        self.nvml = nvml

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def read(self) -> Readings:
        readings = Readings()
        nvml = self.nvml
        if nvml is None:
            readings.put("kvpilot_gpu_available", 0.0)
            return readings
        try:
            handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as exc:
            self._log_once("count", "NVML failed to list GPUs (%s); exporting kvpilot_gpu_available 0", exc)
            readings.put("kvpilot_gpu_available", 0.0)
            return readings
        readings.put("kvpilot_gpu_available", 1.0 if handles else 0.0)
        for index, handle in handles:
            try:
                labels = (str(index), _text(nvml.nvmlDeviceGetUUID(handle)))
            except Exception as exc:
                self._log_once(f"uuid{index}", "NVML: no UUID for GPU %d (%s); skipping it", index, exc)
                continue
            for name, read in GPU_FIELDS.items():
                try:
                    readings.put(name, read(nvml, handle), labels)
                except Exception as exc:  # NVMLError_NotSupported on some boards: leave that sample out
                    self._log_once(f"{name}{index}", "NVML: %s not available for GPU %d (%s)", name, index, exc)
        return readings

    def collect(self) -> Iterator[Metric]:
        yield from build_families(self.read(), GPU)

    def _log_once(self, key: str, message: str, *args: object) -> None:
        with self._lock:
            if key in self._logged:
                return
            self._logged.add(key)
        log.warning(message, *args)

