"""NVML readings -> GPU families: units converted (mW -> W, % -> ratio), one series per GPU.

No GPU here, so NVML is played by an object with nvidia-ml-py's function names and return shapes;
the real library is exercised on the device machine (tests/gpu) and, here, by its failure path.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from kvpilot.sidecar.nvml_collector import NvmlCollector

pytestmark = pytest.mark.unit


class NVMLError(Exception):
    pass


class PlayedNvml:
    """Two GPUs; GPU 1 does not support power readings (as some boards answer)."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, init_error: Exception | None = None) -> None:
        self.init_error = init_error

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str | bytes:
        return f"GPU-{h}aaa" if h == 0 else b"GPU-1bbb"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=(h + 1) * 2**30, total=141 * 2**30, free=0)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=37 + h, memory=10)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 1:
            raise NVMLError("Not Supported")
        return 312_500

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 61 + h


def test_per_gpu_values_in_base_units_with_gpu_and_uuid_labels():
    r = NvmlCollector(PlayedNvml()).read().samples
    assert r["kvpilot_gpu_available"] == {(): 1.0}
    assert r["kvpilot_gpu_memory_used_bytes"] == {("0", "GPU-0aaa"): 2**30, ("1", "GPU-1bbb"): 2 * 2**30}
    assert r["kvpilot_gpu_memory_total_bytes"][("1", "GPU-1bbb")] == 141 * 2**30
    assert r["kvpilot_gpu_utilization_ratio"] == {("0", "GPU-0aaa"): 0.37, ("1", "GPU-1bbb"): 0.38}
    assert r["kvpilot_gpu_power_watts"] == {("0", "GPU-0aaa"): 312.5}  # GPU 1: not supported, left out
    assert r["kvpilot_gpu_temperature_celsius"] == {("0", "GPU-0aaa"): 61.0, ("1", "GPU-1bbb"): 62.0}


def test_unsupported_field_is_logged_once_not_every_scrape(caplog):
    collector = NvmlCollector(PlayedNvml())
    with caplog.at_level(logging.WARNING, "kvpilot.sidecar"):
        for _ in range(3):
            list(collector.collect())
    assert len([r for r in caplog.records if "kvpilot_gpu_power_watts" in r.getMessage()]) == 1


def test_nvml_failure_means_gpu_available_0_and_one_log_line(caplog):
    with caplog.at_level(logging.WARNING, "kvpilot.sidecar"):
        collector = NvmlCollector(PlayedNvml(init_error=NVMLError("NVML Shared Library Not Found")))
        families = [list(collector.collect()) for _ in range(3)][-1]
    assert [(f.name, [s.value for s in f.samples]) for f in families] == [("kvpilot_gpu_available", [0.0])]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "Shared Library Not Found" in lines[0]


def test_the_real_library_without_a_driver_does_not_crash():
    pytest.importorskip("pynvml")
    collector = NvmlCollector()
    names = {f.name for f in collector.collect()}
    assert "kvpilot_gpu_available" in names


@pytest.mark.gpu
def test_real_nvml_on_a_gpu_machine():
    collector = NvmlCollector()
    r = collector.read().samples
    assert r["kvpilot_gpu_available"] == {(): 1.0}
    for (index, uuid), total in r["kvpilot_gpu_memory_total_bytes"].items():
        assert uuid.startswith("GPU-") and index.isdigit()
        assert 0 < r["kvpilot_gpu_memory_used_bytes"][(index, uuid)] <= total
        assert 0 <= r["kvpilot_gpu_utilization_ratio"][(index, uuid)] <= 1
        assert 0 < r["kvpilot_gpu_temperature_celsius"][(index, uuid)] < 120
