"""Triton rotate-half RoPE: one program per token rotates all heads of its q and its k (one launch).

With a query tap (TAP_ROWS > 0) the first TAP_ROWS tokens' rotated q rows are also stored there: what
a sampled metric reads of a decode step that a CUDA graph replays (worker/cuda_graphs.QueryTap).
With STORE the program also writes its token's rotated k and its v into the paged 16-bit caches
[blocks, block_size, Hkv, D] at the token's slot (slot -1: not written), the attention layer's store
kernel folded in: one launch a layer fewer, and k is not read back.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvpilot.engine.kernels.specialization import step_kernel


@triton.jit
def _rotate_heads(x_ptr, out_ptr, t, h0, H, stride_xt, stride_xh, stride_ot, stride_oh, cos, sin, tap_ptr,
                  stride_tt, stride_th, HALF: tl.constexpr, BLOCK_H: tl.constexpr, TAP_ROWS: tl.constexpr):  # fmt: skip
    heads = h0 + tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, HALF)[None, :]
    mask = heads < H
    dtype = out_ptr.dtype.element_ty
    src = x_ptr + t * stride_xt + heads * stride_xh + cols
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    # each product rounded to the activation dtype before the sum, as elementwise torch ops do
    o1 = ((x1 * cos).to(dtype).to(tl.float32) + (-x2 * sin).to(dtype).to(tl.float32)).to(dtype)
    o2 = ((x2 * cos).to(dtype).to(tl.float32) + (x1 * sin).to(dtype).to(tl.float32)).to(dtype)
    dst = out_ptr + t * stride_ot + heads * stride_oh + cols
    tl.store(dst, o1, mask=mask)
    tl.store(dst + HALF, o2, mask=mask)
    if TAP_ROWS > 0:  # noqa: SIM102 (a constexpr branch, compiled out without a tap, around a runtime one)
        if t < TAP_ROWS:
            tap = tap_ptr + t * stride_tt + heads * stride_th + cols
            tl.store(tap, o1, mask=mask)
            tl.store(tap + HALF, o2, mask=mask)
    return o1, o2


@step_kernel
def _rotary_kernel(pos_ptr, inv_freq_ptr, q_ptr, q_out_ptr, k_ptr, k_out_ptr, tap_ptr, HQ, HK,
                   stride_qt, stride_qh, stride_qot, stride_qoh, stride_kt, stride_kh, stride_kot, stride_koh,
                   stride_tt, stride_th, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, stride_vt, stride_vh,
                   HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, TAP_ROWS: tl.constexpr,
                   STORE: tl.constexpr):  # fmt: skip
    # program (token, part): part 0 rotates the token's k (and stores k and v), part p >= 1 its query heads
    # [(p - 1) * BLOCK_HQ, p * BLOCK_HQ): at batch 1 a single program per token was latency-bound (4.6 us a
    # launch on the H200); the angles are recomputed per part (HALF values, cheap)
    t = tl.program_id(0)
    part = tl.program_id(1)
    cols = tl.arange(0, HALF)[None, :]
    angle = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_freq_ptr + cols).to(tl.float32)
    dtype = q_out_ptr.dtype.element_ty
    cos = tl.cos(angle).to(dtype).to(tl.float32)  # rounded as the reference's cos.to(dtype)
    sin = tl.sin(angle).to(dtype).to(tl.float32)
    if part > 0:
        _rotate_heads(q_ptr, q_out_ptr, t, (part - 1) * BLOCK_HQ, HQ, stride_qt, stride_qh, stride_qot, stride_qoh,
                      cos, sin, tap_ptr, stride_tt, stride_th, HALF, BLOCK_HQ, TAP_ROWS)  # fmt: skip
    else:
        k1, k2 = _rotate_heads(k_ptr, k_out_ptr, t, 0, HK, stride_kt, stride_kh, stride_kot, stride_koh, cos, sin,
                               tap_ptr, stride_tt, stride_th, HALF, BLOCK_HK, 0)  # fmt: skip
        if STORE:
            slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
            if slot >= 0:
                heads = tl.arange(0, BLOCK_HK)[:, None]
                mask = heads < HK
                row = slot * HK * (2 * HALF) + heads * (2 * HALF) + cols  # the cache's [Hkv, D] row of this slot
                tl.store(k_cache_ptr + row, k1, mask=mask)
                tl.store(k_cache_ptr + row + HALF, k2, mask=mask)
                src = v_ptr + t * stride_vt + heads * stride_vh + cols
                tl.store(v_cache_ptr + row, tl.load(src, mask=mask), mask=mask)
                tl.store(v_cache_ptr + row + HALF, tl.load(src + HALF, mask=mask), mask=mask)
