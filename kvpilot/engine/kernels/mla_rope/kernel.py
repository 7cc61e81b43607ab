"""Triton RoPE of DeepSeek's rope dims: one program per token, all its heads, angles computed in fp32."""

from __future__ import annotations

import triton.language as tl

from kvpilot.engine.kernels.specialization import step_kernel


@step_kernel
def _mla_rope_kernel(
    pos_ptr, inv_freq_ptr, x_ptr, out_ptr, attention_factor, num_heads, stride_xt, stride_xh, stride_ot, stride_oh,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVE: tl.constexpr,
):
    t = tl.program_id(0)
    pairs = tl.arange(0, BLOCK_HALF)
    mask_p = pairs < HALF
    heads = tl.arange(0, BLOCK_H)
    mask = (heads < num_heads)[:, None] & mask_p[None, :]
    freqs = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_freq_ptr + pairs, mask=mask_p, other=0.0)
    cos = (tl.cos(freqs) * attention_factor)[None, :]
    sin = (tl.sin(freqs) * attention_factor)[None, :]
    if INTERLEAVE:
        first, second = 2 * pairs, 2 * pairs + 1
    else:
        first, second = pairs, pairs + HALF
    x_row = x_ptr + t.to(tl.int64) * stride_xt + heads[:, None] * stride_xh
    x1 = tl.load(x_row + first[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + second[None, :], mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    o_row = out_ptr + t.to(tl.int64) * stride_ot + heads[:, None] * stride_oh
    tl.store(o_row + first[None, :], (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(o_row + second[None, :], (x2 * cos + x1 * sin).to(dtype), mask=mask)
