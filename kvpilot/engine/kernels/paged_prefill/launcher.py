"""Launcher for paged prefill attention: checks the contract, then launches the kernel."""

from __future__ import annotations

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.paged_checks import (
    check_block_tables,
    check_int_vector,
    check_paged_cache,
    dot_dtype,
    dot_precision,
    kernel_window,
)
from kvpilot.engine.kernels.paged_prefill.kernel import LOG2E, _paged_prefill_kernel

ROWS_PER_PROGRAM = 64


def paged_attention_prefill_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_seqlen_q: int | None = None,
    window: int = 0,
) -> torch.Tensor:
    """q [T, Hq, D] packed varlen; block_tables int32 [B, max_blocks]; cu_seqlens_q int32 [B+1]; context_lens int32 [B].
    window > 0: sliding-window attention, each query sees its last `window` positions (itself included).

    `max_seqlen_q` (optional, the longest chunk in the batch, known on the host) sizes the grid;
    without it the grid is sized for T tokens per sequence and surplus programs exit at once.
    """
    check_triton_device(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    block_size, num_kv_heads, group = check_paged_cache(q, k_cache, v_cache)
    batch = context_lens.shape[0]
    check_int_vector("context_lens", context_lens, batch)
    check_int_vector("cu_seqlens_q", cu_seqlens_q, batch + 1)
    check_block_tables(block_tables, batch)
    num_tokens, _, head_dim = q.shape
    out = torch.empty_like(q)
    if num_tokens == 0 or batch == 0:
        return out
    group_pad = triton.next_power_of_2(group)
    block_q = max(1, ROWS_PER_PROGRAM // group_pad)
    block_n = 64 if head_dim <= 128 else 32
    operand_dtype = dot_dtype(q.dtype)
    if max_seqlen_q is None:
        max_seqlen_q = num_tokens
    assert 0 <= max_seqlen_q <= num_tokens, f"max_seqlen_q {max_seqlen_q}: want 0..{num_tokens} (the longest chunk)"
    if max_seqlen_q == 0:
        return out
    grid = (triton.cdiv(max_seqlen_q, block_q), batch, num_kv_heads)
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out,
        scale * LOG2E, kernel_window(window),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_Q=block_q, BLOCK_N=block_n, DOT_DTYPE=operand_dtype, DOT_PRECISION=dot_precision(operand_dtype),
        num_warps=4, num_stages=2,
    )
    return out
