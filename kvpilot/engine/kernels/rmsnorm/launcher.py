"""Launcher for the RMSNorm kernel: checks the contract, then one program per row."""

from __future__ import annotations

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.rmsnorm.kernel import _rmsnorm_kernel


def rmsnorm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, N] (+ residual [T, N]) -> (weight * norm(sum), sum); rows contiguous, one dtype."""
    tensors = (x, weight) if residual is None else (x, weight, residual)
    check_triton_device(*tensors)
    assert x.dim() == 2 and weight.shape == (x.shape[1],), f"x {tuple(x.shape)} / weight {tuple(weight.shape)}"
    assert x.stride(1) == 1 and weight.is_contiguous(), "rows of x and the weight must be contiguous"
    assert weight.dtype == x.dtype, f"weight {weight.dtype} != x {x.dtype}"
    if residual is not None:
        assert residual.shape == x.shape and residual.stride(1) == 1 and residual.dtype == x.dtype
    rows, n = x.shape
    out = torch.empty_like(x)
    total = x if residual is None else torch.empty_like(x)
    if rows:
        block = triton.next_power_of_2(n)
        res = x if residual is None else residual
        _rmsnorm_kernel[(rows,)](x, res, weight, out, total, eps, n, x.stride(0), res.stride(0), out.stride(0),
                                 total.stride(0), HAS_RESIDUAL=residual is not None, BLOCK=block,
                                 num_warps=min(max(block // 256, 1), 16))  # fmt: skip
    return out, total
