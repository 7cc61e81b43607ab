"""Triton MLA decode with weight absorption: many heads per latent tile, split-K over the context.

Program (sequence, head block, split): BLOCK_H query heads share every [BLOCK_N, L + R] tile of the
latent cache, so each tile is read once for BLOCK_H heads. Scores are q_latent.c_kv + q_pe.k_pe;
the output stays in latent space [B, H, L] (the caller applies W_UV and o_proj).
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
def _mla_decode_kernel(
    q_lat_ptr, q_pe_ptr, cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr, part_o_ptr, part_lse_ptr,
    stride_qb, stride_qh, stride_pb, stride_ph, stride_bt, stride_ob, stride_oh,
    stride_wb, stride_wh, stride_ws, stride_lb, stride_lh,
    qk_scale_log2,
    NUM_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, RANK: tl.constexpr, BLOCK_L: tl.constexpr,
    ROPE: tl.constexpr, BLOCK_R: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PE_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr,
):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = heads < NUM_HEADS
    offs_l = tl.arange(0, BLOCK_L)
    offs_r = tl.arange(0, BLOCK_R)
    mask_l = offs_l < RANK
    mask_r = offs_r < ROPE
    q_lat = tl.load(q_lat_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_l[None, :],
                    mask=mask_h[:, None] & mask_l[None, :], other=0.0)
    if PE_GROUP == 0:  # DeepSeek: one rope key shared by every head, q_pe [B, H, ROPE]
        q_pe = tl.load(q_pe_ptr + b * stride_pb + heads[:, None] * stride_ph + offs_r[None, :],
                       mask=mask_h[:, None] & mask_r[None, :], other=0.0)
    else:  # the partial-RoPE conversion: q_pe [B, H, PE_GROUP], head h reads its KV head's PE_GROUP columns
        own = (offs_r[None, :] // PE_GROUP) == (heads // GROUP_SIZE)[:, None]  # of the [Hkv x PE_GROUP] row
        q_pe = tl.load(q_pe_ptr + b * stride_pb + heads[:, None] * stride_ph + (offs_r % PE_GROUP)[None, :],
                       mask=mask_h[:, None] & mask_r[None, :] & own, other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_L], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        block = tl.load(block_tables_ptr + b * stride_bt + offs_n // PAGE, mask=mask_n, other=0)
        row = (block.to(tl.int64) * PAGE + offs_n % PAGE) * (RANK + ROPE)
        c = tl.load(cache_ptr + row[:, None] + offs_l[None, :], mask=mask_n[:, None] & mask_l[None, :], other=0.0)
        pe = tl.load(cache_ptr + row[:, None] + RANK + offs_r[None, :],
                     mask=mask_n[:, None] & mask_r[None, :], other=0.0)
        s = tl.dot(q_lat, tl.trans(c)) + tl.dot(q_pe, tl.trans(pe))
        m_i, l_i, acc = online_softmax_step(s, mask_n, qk_scale_log2, c, m_i, l_i, acc)

    store_output(out_ptr, part_o_ptr, part_lse_ptr, b, heads, split, offs_l, mask_h, mask_l, acc, l_i, m_i,
                 stride_ob, stride_oh, stride_wb, stride_wh, stride_ws, stride_lb, stride_lh, NUM_SPLITS)


def mla_num_splits(num_programs: int, device: torch.device, block_h: int = 16) -> int:
    """About four programs of 16 heads per SM (two of 32), rounded down to a power of two (best measured on
    the H200 at both head-block sizes, docs/benchmarks.md)."""
    return num_splits_for(num_programs, device, per_sm=max(1, 4 * 16 // block_h))


def mla_num_stages(tile_bytes: int, device: torch.device) -> int | None:
    """Pipeline stages for a [BLOCK_N, L + R] cache tile of `tile_bytes`: Triton's default (3) where three
    tiles fit in the device's shared memory (every measured configuration: DeepSeek's 512 + 64 rows take
    221 of the H200's 227 KiB), else as many as fit. Wide partial-RoPE rows (r = 256 with R = 64 per
    KV head: 96 KiB a tile) would otherwise not compile. None (Triton's default) off CUDA."""
    if device.type != "cuda":
        return None
    budget = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    return 3 if 3 * tile_bytes <= budget else max(1, budget // tile_bytes)


def mla_block_h(num_heads: int, rank: int) -> int:
    """Query heads per program: 32 when there are that many and the latent is at most 256 wide (each tile
    read once for all of them: 1.2-1.4x faster than 16 on the H200 for the partial-RoPE conversion of
    Llama-3-8B, docs/benchmarks.md), else 16 (a [32, 512] fp32 accumulator would spill)."""
    return 32 if num_heads >= 32 and rank <= 256 else 16


def mla_decode_triton(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    block_h: int | None = None,
    block_n: int = 64,
    num_warps: int | None = None,
    num_stages: int | None = None,
    pe_group: int = 0,
) -> torch.Tensor:
    """q_latent [B, H, L], q_pe [B, H, R] over cache [blocks, page, L + R] -> latent output [B, H, L].

    `pe_group` P > 0 (the partial-RoPE MLA conversion): the row's R = Hkv x P rope columns are P per KV
    head, q_pe is [B, H, P], and head h's score reads only its KV head's P columns (the kernel masks its
    load into the block-diagonal [H, Hkv x P] query that the shared-rope formulation needs)."""
    check_triton_device(q_latent, q_pe, kv_cache, block_tables, context_lens)
    assert q_latent.dim() == 3 and q_pe.dim() == 3 and q_latent.shape[:2] == q_pe.shape[:2], (
        f"q_latent [B, H, L] and q_pe [B, H, R] disagree: {tuple(q_latent.shape)} vs {tuple(q_pe.shape)}"
    )
    batch, num_heads, rank = q_latent.shape
    rope = kv_cache.shape[2] - rank if pe_group else q_pe.shape[2]
    group_size = 1
    if pe_group:
        assert q_pe.shape[2] == pe_group and rope > 0 and rope % pe_group == 0, (
            f"q_pe [B, H, {pe_group}] needs a rope part of Hkv x {pe_group} columns, the cache has {rope}"
        )
        assert num_heads % (rope // pe_group) == 0, f"{num_heads} heads over {rope // pe_group} KV heads"
        group_size = num_heads // (rope // pe_group)
    assert kv_cache.dim() == 3 and kv_cache.shape[2] == rank + rope and kv_cache.is_contiguous(), (
        f"cache must be contiguous [blocks, page, {rank}+{rope}], got {tuple(kv_cache.shape)}"
    )
    assert q_latent.dtype == q_pe.dtype == kv_cache.dtype, "q_latent, q_pe and cache must share one dtype"
    assert q_latent.stride(-1) == 1 and q_pe.stride(-1) == 1, "last dims must be contiguous"
    assert block_tables.dtype == torch.int32 and block_tables.shape[0] == batch and block_tables.stride(1) == 1
    assert context_lens.dtype == torch.int32 and context_lens.shape == (batch,)
    block_h = block_h or mla_block_h(num_heads, rank)
    assert block_h >= 16 and block_n >= 16, "tl.dot needs tiles of at least 16"
    head_blocks = triton.cdiv(num_heads, block_h)
    if num_splits is None:
        num_splits = mla_num_splits(batch * head_blocks, q_latent.device, block_h)
    out = torch.empty_like(q_latent)
    if batch == 0:
        return out
    block_l, block_r = triton.next_power_of_2(rank), max(16, triton.next_power_of_2(rope))
    if num_stages is None:
        num_stages = mla_num_stages(block_n * (block_l + block_r) * kv_cache.element_size(), kv_cache.device)
    stages = {} if num_stages is None else {"num_stages": num_stages}
    part_o, part_lse = split_scratch(out, num_splits)
    _mla_decode_kernel[(batch, head_blocks, num_splits)](
        q_latent, q_pe, kv_cache, block_tables, context_lens, out, part_o, part_lse,
        q_latent.stride(0), q_latent.stride(1), q_pe.stride(0), q_pe.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1),
        part_o.stride(0), part_o.stride(1), part_o.stride(2) if num_splits > 1 else 0,
        part_lse.stride(0), part_lse.stride(1),
        scale * LOG2E,
        NUM_HEADS=num_heads, BLOCK_H=block_h, RANK=rank, BLOCK_L=block_l,
        ROPE=rope, BLOCK_R=block_r, PAGE=kv_cache.shape[1], BLOCK_N=block_n,
        NUM_SPLITS=num_splits, PE_GROUP=pe_group, GROUP_SIZE=group_size,
        num_warps=num_warps or (8 if rank >= 256 and block_h == 16 else 4), **stages,
    )
    if num_splits > 1:
        split_reduce(part_o, part_lse, out)
    return out
