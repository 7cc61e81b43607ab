"""Launcher for the RoPE kernel: checks the contract, then one program per token for q and one for k."""

from __future__ import annotations

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.rotary.kernel import _rotary_kernel


def rotary_triton(
    positions: torch.Tensor, inv_freq: torch.Tensor, q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D], k [T, Hkv, D] (last dim contiguous; D/2 a power of two) -> rotated copies."""
    check_triton_device(positions, inv_freq, q, k)
    assert q.dim() == 3 and k.dim() == 3 and q.shape[0] == k.shape[0] == positions.shape[0], "q/k [T, H, D], positions [T]"
    head_dim = q.shape[2]
    half = head_dim // 2
    assert k.shape[2] == head_dim and inv_freq.shape == (half,), f"inv_freq {tuple(inv_freq.shape)} != [{half}]"
    assert half & (half - 1) == 0 and q.stride(2) == 1 and k.stride(2) == 1, "D/2 a power of two, last dim contiguous"
    assert inv_freq.is_contiguous() and positions.is_contiguous()
    outs = []
    for x in (q, k):
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if x.shape[0]:
            _rotary_kernel[(x.shape[0],)](positions, inv_freq, x, out, x.shape[1], x.stride(0), x.stride(1),
                                          out.stride(0), out.stride(1), HALF=half,
                                          BLOCK_H=triton.next_power_of_2(x.shape[1]))  # fmt: skip
        outs.append(out)
    return outs[0], outs[1]
