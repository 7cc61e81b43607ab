"""A Triton y[M, N] = x[M, K] @ w[N, K].T for bench/gemm_sweep.py: fp32 accumulation, optional split over K.

Measured against cuBLAS at the decode shapes on the H200 (docs/benchmarks.md, issue 30 session 15) it lost
at almost every point, so the engine keeps cuBLAS; the kernel stays here as the sweep's candidate.
Tiles are grouped along M (GROUP_M tiles of one column block run next to each other) so the weight tile a
column block reads is shared in L2 by the programs that need it. With SPLIT_K > 1 each program sums one
slice of K into a fp32 partial [SPLIT_K, M, N]; `_sum_partials_kernel` adds the slices in a fixed order
(deterministic, unlike atomics) and rounds to the output dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvpilot.engine.kernels.dispatch import check_triton_device


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


SUM_BLOCK = 1024


@dataclass(frozen=True)
class GemmConfig:
    """One tiling of the kernel (kernel.py); `num_warps`/`num_stages` go to Triton."""

    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def label(self) -> str:
        return (f"m{self.block_m}n{self.block_n}k{self.block_k}g{self.group_m}s{self.split_k}"
                f"w{self.num_warps}st{self.num_stages}")  # fmt: skip


def linear_triton(x: torch.Tensor, weight: torch.Tensor, config: GemmConfig) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T -> [M, N] in x's dtype (rows of both contiguous in K)."""
    check_triton_device(x, weight)
    assert x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1], (
        f"{tuple(x.shape)} @ {tuple(weight.shape)}.T"
    )
    assert x.stride(1) == 1 and weight.stride(1) == 1 and x.dtype == weight.dtype
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    c = config
    tiles = triton.cdiv(m, c.block_m) * triton.cdiv(n, c.block_n)
    if c.split_k == 1:
        _gemm_kernel[(tiles, 1)](x, weight, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0), 0, 1,
                                 BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
                                 num_warps=c.num_warps, num_stages=c.num_stages)  # fmt: skip
        return out
    partial = torch.empty((c.split_k, m, n), dtype=torch.float32, device=x.device)
    _gemm_kernel[(tiles, c.split_k)](x, weight, partial, m, n, k, x.stride(0), weight.stride(0), n, m * n, c.split_k,
                                     BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
                                     num_warps=c.num_warps, num_stages=c.num_stages)  # fmt: skip
    _sum_partials_kernel[(triton.cdiv(m * n, SUM_BLOCK),)](
        partial, out, m * n, SPLIT_K=c.split_k, BLOCK=SUM_BLOCK
    )
    return out


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[0, N] = x[0, K] @ w[N, K].T for one row: each program reduces BLOCK_N weight rows over K."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wn + ks[None, :]
    for k in range(0, K, BLOCK_K):
        k_mask = (k + ks) < K
        x = tl.load(x_ptr + k + ks, mask=k_mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        acc += w * x[None, :]
        w_ptrs += BLOCK_K
    tl.store(out_ptr + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=row_mask)


def gemv_triton(x: torch.Tensor, weight: torch.Tensor, block_n: int, block_k: int, num_warps: int,
                num_stages: int) -> torch.Tensor:  # fmt: skip
    """x [1, K] @ weight[N, K].T -> [1, N]."""
    check_triton_device(x, weight)
    assert x.shape[0] == 1 and x.is_contiguous() and weight.stride(1) == 1 and x.shape[1] == weight.shape[1]
    n, k = weight.shape
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, weight, out, n, k, weight.stride(0), BLOCK_N=block_n,
                                             BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)  # fmt: skip
    return out
