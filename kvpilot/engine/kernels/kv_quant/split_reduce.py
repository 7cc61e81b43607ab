"""Merge split-K partial attention outputs by their log-sum-exp (base 2); shared by the decode kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvpilot.engine.kernels.interpreter_compat import patch_interpreter

patch_interpreter()


@triton.jit
def _split_reduce_kernel(
    part_o_ptr, part_lse_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_SPLITS
    lse = tl.load(part_lse_ptr + b * stride_lb + h * stride_lh + offs_s, mask=mask_s, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max > float("-inf"), lse_max, 0.0)  # context length 0: every split empty
    weight = tl.where(lse > float("-inf"), tl.exp2(lse - lse_max), 0.0)
    part = tl.load(
        part_o_ptr + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=mask_s[:, None] & (offs_d[None, :] < DIM), other=0.0,
    )
    out = tl.sum(part * weight[:, None], axis=0) / tl.maximum(tl.sum(weight, axis=0), 1e-30)  # 0: context length 0
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=offs_d < DIM)


def split_reduce(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """part_o fp32 [B, H, S, D] (each split normalised), part_lse fp32 [B, H, S] (log2) -> out [B, H, D]."""
    batch, heads, splits, dim = part_o.shape
    assert part_lse.shape == (batch, heads, splits) and out.shape == (batch, heads, dim)
    assert part_o.stride(-1) == 1 and part_lse.stride(-1) == 1 and out.stride(-1) == 1
    _split_reduce_kernel[(batch, heads)](
        part_o, part_lse, out,
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1),
        NUM_SPLITS=splits, BLOCK_S=max(2, triton.next_power_of_2(splits)), DIM=dim,
        BLOCK_D=triton.next_power_of_2(dim),
    )


def pow2_splits(num_programs: int, sms: int, max_context: int, block_n: int, *, waves: int = 2,
                min_tiles: int = 2, max_splits: int = 64) -> int:
    """Context splits for a decode launch, a power of two: enough for about `waves` programs per SM, but
    at least `min_tiles` tiles of `block_n` tokens per split of the longest context, and at most
    `max_splits`. At batch 1 x 32768 tokens (8 KV heads, 132 SMs) that is 64 splits, where a cap of 16
    left 128 programs of 16 tiles each on the H200 (docs/benchmarks.md, session 4)."""
    want = -(-waves * sms // max(1, num_programs))
    cap = max(1, min(max_splits, max_context // (min_tiles * block_n)))
    cap = 1 << (cap.bit_length() - 1)  # largest power of two <= cap
    return min(cap, 1 << max(0, want - 1).bit_length())
