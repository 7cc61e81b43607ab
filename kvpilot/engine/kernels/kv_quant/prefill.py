"""Prefill over an 8-bit cache: dequantise the batch's blocks into a compact 16-bit buffer, then run
the base paged prefill kernel on it.

Prefill is compute-bound, so the extra pass (read 8-bit, write 16-bit for the blocks this batch
touches, then read them again) costs little next to the attention itself; it keeps a single
prefill kernel to maintain. The buffer holds one block per block-table entry (`flat_block_tables`,
padding entries skipped), so nothing is read back to the host: `compact_block_tables` (each distinct
block once) needed `torch.unique` and a boolean mask, two host syncs per layer of every prefill step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvpilot.engine.kernels.dispatch import backend_for, check_triton_device
from kvpilot.engine.kernels.interpreter_compat import patch_interpreter
from kvpilot.engine.kernels.kv_quant.layout import check_cache_layout, check_scale_layout
from kvpilot.engine.kernels.kv_quant.reference import dequantize_blocks_reference, mode_of
from kvpilot.engine.kernels.specialization import step_kernel

patch_interpreter()


@step_kernel
def _dequantize_blocks_kernel(
    cache_ptr, scale_ptr, block_ids_ptr, out_ptr,
    stride_cb, stride_ct, stride_ch, stride_cd, stride_sb, stride_st, stride_sh,
    ROWS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, IS_INT8: tl.constexpr,
):
    # One program per block: its ROWS = block_size * Hkv rows (token-major, then head) of HEAD_DIM
    # values, read through the cache's strides (any layout of kv_quant.layout), written contiguous.
    i = tl.program_id(0)
    block = tl.load(block_ids_ptr + i).to(tl.int64)
    if block < 0:  # a padding entry of the block table: no block, never read
        return
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    mask_r = offs_r < ROWS
    mask = mask_r[:, None] & (offs_d[None, :] < HEAD_DIM)
    token, head = offs_r // NUM_KV_HEADS, offs_r % NUM_KV_HEADS
    src = (block * stride_cb + token * stride_ct + head * stride_ch)[:, None] + offs_d[None, :] * stride_cd
    x = tl.load(cache_ptr + src, mask=mask, other=0.0).to(tl.float32)
    tile = offs_r[:, None] * HEAD_DIM + offs_d[None, :]
    if IS_INT8:
        s = tl.load(scale_ptr + block * stride_sb + token * stride_st + head * stride_sh, mask=mask_r, other=0.0)
    else:
        s = tl.load(scale_ptr + head, mask=mask_r, other=0.0)
    x = x * s.to(tl.float32)[:, None]
    tl.store(out_ptr + i.to(tl.int64) * ROWS * HEAD_DIM + tile, x.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_blocks_triton(
    cache_q: torch.Tensor, scale: torch.Tensor, block_ids: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """Blocks block_ids int32 [n] of an int8/fp8 cache -> out_dtype [n, block_size, Hkv, D]; the rows of an
    id of -1 (block-table padding) are left unwritten (never read)."""
    check_triton_device(cache_q, scale, block_ids)
    is_int8 = mode_of(cache_q) == "int8"
    check_cache_layout(cache_q, "cache")
    _, page, num_kv_heads, head_dim = cache_q.shape
    expected = cache_q.shape[:3] if is_int8 else (num_kv_heads,)
    assert scale.shape == expected, f"scale must be {tuple(expected)}, got {tuple(scale.shape)}"
    if is_int8:
        check_scale_layout(scale, "scale")
    else:
        assert scale.is_contiguous(), "fp8 per-head scales must be contiguous"
    assert block_ids.dim() == 1 and block_ids.dtype == torch.int32, "block_ids must be int32 [n]"
    assert out_dtype in (torch.float16, torch.bfloat16, torch.float32), f"out_dtype {out_dtype} not supported"
    out = torch.empty(block_ids.shape[0], page, num_kv_heads, head_dim, dtype=out_dtype, device=cache_q.device)
    if block_ids.shape[0] == 0:
        return out
    _dequantize_blocks_kernel[(block_ids.shape[0],)](
        cache_q, scale, block_ids, out,
        *cache_q.stride(), *(scale.stride() if is_int8 else (0, 0, 0)),
        ROWS=page * num_kv_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_R=triton.next_power_of_2(page * num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        IS_INT8=is_int8,
    )
    return out


def flat_block_tables(block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int32 [B * W]: every entry of block_tables [B, W], -1 padding kept (skipped by the dequantisation),
    tables int32 [B, W] indexing into ids, -1 kept). On the device, no host sync; a block that two sequences
    share (a cached prefix) is dequantised once per entry."""
    ids = block_tables.reshape(-1).to(torch.int32)
    index = torch.arange(ids.numel(), dtype=torch.int32, device=block_tables.device).view(block_tables.shape)
    return ids, torch.where(block_tables >= 0, index, torch.full_like(index, -1))


def compact_block_tables(block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int32 [n]: the distinct blocks used, tables int32 like block_tables indexing into ids; -1 kept)."""
    used = block_tables[block_tables >= 0]
    ids = torch.unique(used)
    remapped = torch.searchsorted(ids, block_tables.clamp_min(0).to(ids.dtype))
    remapped = torch.where(block_tables >= 0, remapped, torch.full_like(remapped, -1))
    return ids.to(torch.int32), remapped.to(torch.int32)


def dequantize_blocks(
    cache_q: torch.Tensor, scale: torch.Tensor, block_ids: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """Dispatching wrapper (KVPILOT_KERNELS) over the Triton kernel and the torch reference."""
    if backend_for(cache_q) == "triton":
        return dequantize_blocks_triton(cache_q, scale, block_ids, out_dtype)
    return dequantize_blocks_reference(cache_q, scale, block_ids, out_dtype)


def paged_attention_prefill_quant(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_seqlen_q: int | None = None,
) -> torch.Tensor:
    """`paged_attention_prefill` (docs/dev/interfaces.md) over an int8/fp8 cache, in q's dtype."""
    from kvpilot.engine.kernels import paged_attention_prefill

    ids, tables = flat_block_tables(block_tables)
    k = dequantize_blocks(k_cache, k_scale, ids, q.dtype)
    v = dequantize_blocks(v_cache, v_scale, ids, q.dtype)
    return paged_attention_prefill(q, k, v, tables, cu_seqlens_q, context_lens, scale, max_seqlen_q)
