"""Triton grouped GEMMs over expert-sorted assignments (align.py): gate/up with SiLU-and-mul, then down.

A program owns BLOCK_M sorted assignment rows of one expert and BLOCK_N output columns; it streams
that expert's weight tile over K and multiplies the rows it gathers. Pad rows (id >= num_valid) load
zeros and store nothing; blocks past `num_padded` return at once, so the grid can be sized for the
worst routing and captured.
"""

from __future__ import annotations

import triton
import triton.language as tl

# the per-step counts (assignments) change every prefill: not part of the specialisation key
_STEP = {"do_not_specialize": ["num_valid"]}


@triton.jit(**_STEP)
def _moe_gate_up_kernel(
    x_ptr, w_ptr, out_ptr, sorted_ids_ptr, block_experts_ptr, num_padded_ptr,
    num_valid, N, K, stride_xm, stride_we, stride_wn, stride_om,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """out[i, n] = silu(x[i // TOP_K] . w[e, n]) * (x[i // TOP_K] . w[e, N + n]) for the block's rows i."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = ids < num_valid
    rows = (ids // TOP_K).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :]
    g_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    u_ptrs = g_ptrs + N * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & mask_k[None, :], other=0.0).to(DOT_DTYPE)
        wg = tl.load(g_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0).to(DOT_DTYPE)
        wu = tl.load(u_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0).to(DOT_DTYPE)
        acc_g = tl.dot(a, wg, acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(a, wu, acc_u, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    dtype = out_ptr.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)  # rounded as the GEMM's output, then as F.silu's
    u = acc_u.to(dtype).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    out_ptrs = out_ptr + ids[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, (silu * u).to(dtype), mask=valid[:, None] & mask_n[None, :])


@triton.jit(**_STEP)
def _moe_down_kernel(
    h_ptr, w_ptr, out_ptr, weights_ptr, sorted_ids_ptr, block_experts_ptr, num_padded_ptr,
    num_valid, N, K, stride_hm, stride_we, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """out[i, n] = weights[i] * (h[i] . w[e, n]) for the block's rows i (one row per assignment)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = ids < num_valid
    rows = ids.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = h_ptr + rows[:, None] * stride_hm + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & mask_k[None, :], other=0.0).to(DOT_DTYPE)
        w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0).to(DOT_DTYPE)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    dtype = out_ptr.dtype.element_ty
    scale = tl.load(weights_ptr + rows, mask=valid, other=0.0)
    y = acc.to(dtype).to(tl.float32) * scale[:, None]  # the expert's output rounded, times its fp32 weight
    out_ptrs = out_ptr + rows[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, y.to(dtype), mask=valid[:, None] & mask_n[None, :])
