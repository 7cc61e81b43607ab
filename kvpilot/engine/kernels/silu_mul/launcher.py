"""Launcher for silu(gate) * up: checks the contract, then a [rows, column tiles] grid."""

from __future__ import annotations

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.silu_mul.kernel import _silu_mul_kernel

BLOCK = 1024


def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [T, N] (rows contiguous, one dtype) -> silu(gate) * up [T, N]."""
    check_triton_device(gate, up)
    assert gate.dim() == 2 and gate.shape == up.shape, f"gate {tuple(gate.shape)} / up {tuple(up.shape)}"
    assert gate.stride(1) == 1 and up.stride(1) == 1 and gate.dtype == up.dtype
    rows, n = gate.shape
    out = torch.empty_like(gate)
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(n, BLOCK))](gate, up, out, n, gate.stride(0), up.stride(0),
                                                        out.stride(0), BLOCK=BLOCK)  # fmt: skip
    return out
