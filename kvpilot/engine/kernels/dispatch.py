"""Choose between the Triton kernels and the pure-torch references for one call."""

from __future__ import annotations

import os

import torch

BACKENDS = ("triton", "torch")
ENV_VAR = "KVPILOT_KERNELS"


def backend_for(tensor: torch.Tensor) -> str:
    """`KVPILOT_KERNELS=triton|torch` forces a backend; unset (or `auto`) means triton on CUDA, torch elsewhere."""
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced in BACKENDS:
        return forced
    if forced not in ("", "auto"):
        raise ValueError(f"{ENV_VAR}={forced!r} is not a kernel backend; use one of {BACKENDS} or leave it unset")
    return "triton" if tensor.is_cuda else "torch"


def check_triton_device(*tensors: torch.Tensor) -> None:
    """Triton needs CUDA tensors, or CPU tensors when the interpreter (TRITON_INTERPRET=1) is on."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type == "cuda":
        return
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return
    raise ValueError(
        f"the Triton kernels need CUDA tensors (got {device}); on CPU set TRITON_INTERPRET=1 before "
        f"importing triton, or use {ENV_VAR}=torch"
    )
