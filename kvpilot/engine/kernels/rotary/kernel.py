"""Triton rotate-half RoPE: one program per (token, q or k), all heads of it at once."""

from __future__ import annotations

import triton.language as tl

from kvpilot.engine.kernels.specialization import step_kernel


@step_kernel
def _rotary_kernel(pos_ptr, inv_freq_ptr, x_ptr, out_ptr, H, stride_xt, stride_xh, stride_ot, stride_oh,
                   HALF: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    t = tl.program_id(0)
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, HALF)[None, :]
    mask = heads < H
    angle = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_freq_ptr + cols).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    cos = tl.cos(angle).to(dtype).to(tl.float32)  # rounded as the reference's cos.to(dtype)
    sin = tl.sin(angle).to(dtype).to(tl.float32)
    src = x_ptr + t * stride_xt + heads * stride_xh + cols
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    # each product rounded to the activation dtype before the sum, as elementwise torch ops do
    o1 = (x1 * cos).to(dtype).to(tl.float32) + (-x2 * sin).to(dtype).to(tl.float32)
    o2 = (x2 * cos).to(dtype).to(tl.float32) + (x1 * sin).to(dtype).to(tl.float32)
    dst = out_ptr + t * stride_ot + heads * stride_oh + cols
    tl.store(dst, o1.to(dtype), mask=mask)
    tl.store(dst + HALF, o2.to(dtype), mask=mask)
