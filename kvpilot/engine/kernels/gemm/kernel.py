"""Triton y[M, N] = x[M, K] @ w[N, K].T, fp32 accumulation, optional split over K.

Tiles are grouped along M (GROUP_M tiles of one column block run next to each other) so the weight tile a
column block reads is shared in L2 by the programs that need it. With SPLIT_K > 1 each program sums one
slice of K into a fp32 partial [SPLIT_K, M, N]; `_sum_partials_kernel` adds the slices in a fixed order
(deterministic, unlike atomics) and rounds to the output dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, stride_os,
                 SPLIT_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_start = split * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm + (k_start + ks)[None, :]
    w_ptrs = w_ptr + cols[:, None].to(tl.int64) * stride_wn + (k_start + ks)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        k_mask = (k + ks) < k_end
        x = tl.load(x_ptrs, mask=(rows[:, None] < M) & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=(cols[:, None] < N) & k_mask[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    out_ptrs = out_ptr + split * stride_os + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sum_partials_kernel(part_ptr, out_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
