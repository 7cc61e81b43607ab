"""Launcher for DeepSeek's RoPE: checks the contract, one program per token."""

from __future__ import annotations

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.mla_rope.kernel import _mla_rope_kernel


def mla_rope_triton(
    positions: torch.Tensor, inv_freq: torch.Tensor, x: torch.Tensor, attention_factor: float, interleave: bool
) -> torch.Tensor:
    """x [T, heads, R] (last dim contiguous; any token / head strides) at positions [T] -> new [T, heads, R]."""
    check_triton_device(positions, inv_freq, x)
    assert x.dim() == 3 and x.stride(2) == 1, f"x must be [T, heads, R] with contiguous rows, got {tuple(x.shape)}"
    tokens, heads, rope = x.shape
    half = rope // 2
    assert rope % 2 == 0 and inv_freq.shape == (half,) and inv_freq.dtype == torch.float32, (
        f"inv_freq must be fp32 [{half}] for R = {rope}, got {inv_freq.dtype} {tuple(inv_freq.shape)}"
    )
    assert positions.shape == (tokens,), f"positions {tuple(positions.shape)} for {tokens} tokens"
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if tokens:
        _mla_rope_kernel[(tokens,)](
            positions, inv_freq, x, out, float(attention_factor), heads, x.stride(0), x.stride(1),
            out.stride(0), out.stride(1), HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
            BLOCK_H=triton.next_power_of_2(heads), INTERLEAVE=interleave,
        )  # fmt: skip
    return out
