"""Test tiers and machine detection shared by every test."""

from __future__ import annotations

import os
import shutil

# Triton kernels run in the interpreter on machines without an NVIDIA GPU. This must be
# set before anything imports triton.
HAS_NVIDIA = shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")
if not HAS_NVIDIA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest_plugins = ["tests.harness.cluster", "tests.harness.gateway", "tests.harness.local_fleet"]

_SKIPPED_GPU: list[str] = []


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="gpu tier: no CUDA device on this machine, not run here")
    for item in gpu_items:
        item.add_marker(skip)
        _SKIPPED_GPU.append(item.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if _SKIPPED_GPU:
        terminalreporter.write_sep("=", "gpu tier")
        terminalreporter.write_line(
            f"{len(_SKIPPED_GPU)} gpu-tier tests were NOT run here (no CUDA device); "
            "run them on the device machine: pytest -m gpu"
        )
