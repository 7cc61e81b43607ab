"""Triton decode for the MLA conversion with RoPE on every dim: keys decompressed and rotated in the program.

Program (sequence, KV head, split): the G query heads of one KV head (padded to BLOCK_G rows for
tl.dot) walk the sequence's context in tiles of BLOCK_N cached latent rows c [BLOCK_N, r]. Per tile:
k1 = c W1^T + b1, k2 = c W2^T + b2 (W1, W2: the KV head's first and second half of W_UK's rows, held
for the whole walk), rotate-half RoPE at positions n, scores q1.kr1 + q2.kr2, online softmax, and
acc += p c (the value side stays in latent space). Split-K over the context as kernels/mla_decode does, reduced by kv_quant/split_reduce.
A step costs 2 r D multiply-adds per cached token and KV head (the decompression) and reads r numbers
per token and layer: compute-bound where exact attention is bandwidth-bound.

The rotation angles n theta are built by the angle-addition formula, (n0 + i) theta from n0 theta (a
tile's first position: HALF sines and cosines per tile) and i theta (i < BLOCK_N: a table made once per
program), so a tile pays four fp32 multiply-adds per key pair instead of a precise sine and cosine: on
the H200 the per-element sin/cos was about as dear as the decompression's tensor-core work. The result
matches the model's rotary (cos/sin of fp32 n x inv_freq) to the rounding of that product.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.interpreter_compat import patch_interpreter
from kvpilot.engine.kernels.kv_quant.split_reduce import split_reduce
from kvpilot.engine.kernels.mla_decode.split_softmax import (
    num_splits_for,
    online_softmax_step,
    split_scratch,
    store_output,
)
from kvpilot.engine.kernels.specialization import step_kernel

LOG2E = 1.4426950408889634

patch_interpreter()


@step_kernel
def _mla_conversion_decode_kernel(
    q_ptr, cache_ptr, up_k_ptr, k_bias_ptr, inv_freq_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_o_ptr, part_lse_ptr,
    stride_qb, stride_qh, stride_bt, stride_ob, stride_oh,
    stride_wb, stride_wh, stride_ws, stride_lb, stride_lh,
    qk_scale_log2,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HALF: tl.constexpr, RANK: tl.constexpr, BLOCK_R: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    b = tl.program_id(0)
    g = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)

    rows_g = tl.arange(0, BLOCK_G)
    mask_g = rows_g < GROUP
    heads = g * GROUP + rows_g
    offs_d = tl.arange(0, HALF)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < RANK
    q_row = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    q1 = tl.load(q_row + offs_d[None, :], mask=mask_g[:, None], other=0.0)  # [BLOCK_G, HALF]
    q2 = tl.load(q_row + HALF + offs_d[None, :], mask=mask_g[:, None], other=0.0)
    # this KV head's W_UK rows [2 HALF, r]: first half W1, second half W2, as [HALF, BLOCK_R]
    w_rows = up_k_ptr + (g * 2 * HALF + offs_d)[:, None] * RANK + offs_r[None, :]
    w1 = tl.load(w_rows, mask=mask_r[None, :], other=0.0)
    w2 = tl.load(w_rows + HALF * RANK, mask=mask_r[None, :], other=0.0)
    if HAS_BIAS:
        b1 = tl.load(k_bias_ptr + g * 2 * HALF + offs_d).to(tl.float32)
        b2 = tl.load(k_bias_ptr + g * 2 * HALF + HALF + offs_d).to(tl.float32)
    inv_freq = tl.load(inv_freq_ptr + offs_d)  # fp32 [HALF]

    step = tl.arange(0, BLOCK_N).to(tl.float32)[:, None] * inv_freq[None, :]  # i theta, i < BLOCK_N
    cos_i = tl.cos(step)
    sin_i = tl.sin(step)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_R], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        block = tl.load(block_tables_ptr + b * stride_bt + offs_n // PAGE, mask=mask_n, other=0)
        row = (block.to(tl.int64) * PAGE + offs_n % PAGE) * RANK
        c = tl.load(cache_ptr + row[:, None] + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :], other=0.0)
        k1 = tl.dot(c, tl.trans(w1))  # [BLOCK_N, HALF] fp32
        k2 = tl.dot(c, tl.trans(w2))
        if HAS_BIAS:
            k1 += b1[None, :]
            k2 += b2[None, :]
        # the cached token's position is its index: angle (n0 + i) theta = n0 theta + i theta, so a tile
        # takes HALF sines and cosines of its first position and rotates the program's in-tile table
        base = inv_freq * n0  # fp32
        cos_b = tl.cos(base)[None, :]
        sin_b = tl.sin(base)[None, :]
        cos = cos_b * cos_i - sin_b * sin_i
        sin = sin_b * cos_i + cos_b * sin_i
        kr1 = (k1 * cos - k2 * sin).to(c.dtype)
        kr2 = (k2 * cos + k1 * sin).to(c.dtype)
        s = tl.dot(q1, tl.trans(kr1)) + tl.dot(q2, tl.trans(kr2))  # [BLOCK_G, BLOCK_N]
        m_i, l_i, acc = online_softmax_step(s, mask_n, qk_scale_log2, c, m_i, l_i, acc)

    store_output(out_ptr, part_o_ptr, part_lse_ptr, b, heads, split, offs_r, mask_g, mask_r, acc, l_i, m_i,
                 stride_ob, stride_oh, stride_wb, stride_wh, stride_ws, stride_lb, stride_lh, NUM_SPLITS)


def mla_conversion_decode_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    up_k: torch.Tensor,
    k_bias: torch.Tensor | None,
    inv_freq: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_kv_heads: int,
    num_splits: int | None = None,
    block_n: int = 32,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """q [B, H, D] (after RoPE) over the latent cache [blocks, page, r] with W_UK = up_k [Hkv*D, r] (and
    b_K [Hkv*D]) -> latent output sum_n p_n c_n [B, H, r] in q's dtype."""
    check_triton_device(q, kv_cache, up_k, inv_freq, block_tables, context_lens)
    batch, num_heads, head_dim = q.shape
    rank = kv_cache.shape[2]
    half = head_dim // 2
    assert q.stride(-1) == 1 and head_dim % 2 == 0 and half & (half - 1) == 0 and half >= 16, (
        f"head_dim {head_dim}: the kernel takes an even head_dim whose half is a power of two >= 16"
    )
    assert num_heads % num_kv_heads == 0, f"{num_heads} query heads over {num_kv_heads} KV heads"
    assert up_k.shape == (num_kv_heads * head_dim, rank) and up_k.is_contiguous(), (
        f"up_k must be contiguous [{num_kv_heads * head_dim}, {rank}], got {tuple(up_k.shape)}"
    )
    assert kv_cache.dim() == 3 and kv_cache.is_contiguous(), "cache must be contiguous [blocks, page, r]"
    assert q.dtype == kv_cache.dtype == up_k.dtype, "q, cache and up_k must share one dtype"
    assert inv_freq.shape == (half,) and inv_freq.dtype == torch.float32
    assert block_tables.dtype == torch.int32 and block_tables.shape[0] == batch and block_tables.stride(1) == 1
    assert context_lens.dtype == torch.int32 and context_lens.shape == (batch,)
    group = num_heads // num_kv_heads
    if num_splits is None:
        num_splits = num_splits_for(batch * num_kv_heads, q.device, per_sm=2)  # a walk is compute-heavy
    out = torch.empty(batch, num_heads, rank, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    part_o, part_lse = split_scratch(out, num_splits)
    bias = k_bias if k_bias is not None else up_k  # any pointer: HAS_BIAS=False never reads it
    _mla_conversion_decode_kernel[(batch, num_kv_heads, num_splits)](
        q, kv_cache, up_k, bias, inv_freq, block_tables, context_lens, out, part_o, part_lse,
        q.stride(0), q.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
        part_o.stride(0), part_o.stride(1), part_o.stride(2) if num_splits > 1 else 0,
        part_lse.stride(0), part_lse.stride(1),
        scale * LOG2E,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HALF=half, RANK=rank,
        BLOCK_R=max(16, triton.next_power_of_2(rank)), PAGE=kv_cache.shape[1], BLOCK_N=block_n,
        NUM_SPLITS=num_splits, HAS_BIAS=k_bias is not None, num_warps=num_warps or (8 if rank >= 256 else 4),
        **({} if num_stages is None else {"num_stages": num_stages}),
    )
    if num_splits > 1:
        split_reduce(part_o, part_lse, out)
    return out
