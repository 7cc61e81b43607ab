"""Launcher for the Triton GEMM: checks the contract, then one tile grid (and a sum over K slices)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.gemm.kernel import _gemm_kernel, _sum_partials_kernel

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
    assert x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1], f"{tuple(x.shape)} @ {tuple(weight.shape)}.T"
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
    _sum_partials_kernel[(triton.cdiv(m * n, SUM_BLOCK),)](partial, out, m * n, SPLIT_K=c.split_k, BLOCK=SUM_BLOCK)
    return out
