"""Triton silu(gate) * up over [T, N] rows, BLOCK columns per program."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def silu_mul_values(g, u, dtype: tl.constexpr):
    """silu(g) * u in `dtype` from fp32 g, u, rounded as F.silu(gate) * up rounds (also gemv_norm's input)."""
    silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # rounded as F.silu's output
    return (silu * u).to(dtype)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, N, stride_g, stride_u, stride_o, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    g = tl.load(g_ptr + t * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + t * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_o + cols, silu_mul_values(g, u, out_ptr.dtype.element_ty), mask=mask)
