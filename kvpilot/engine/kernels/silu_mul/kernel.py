"""Triton silu(gate) * up over [T, N] rows, BLOCK columns per program."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, N, stride_g, stride_u, stride_o, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    g = tl.load(g_ptr + t * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + t * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)  # rounded as F.silu's output
    tl.store(out_ptr + t * stride_o + cols, (silu * u).to(dtype), mask=mask)
