"""Triton helpers shared by the paged attention kernels: gather a tile of tokens from paged blocks."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _gather_kv_tile(
    cache_ptr,
    block_table_ptr,
    tokens,
    token_mask,
    kv_head,
    offs_d,
    stride_block,
    stride_token,
    stride_head,
    BLOCK_SIZE: tl.constexpr,
):
    """Rows [BLOCK_N, D] of one KV head for logical token positions `tokens` of one sequence.

    A tile may span several paged blocks (tile > block size) or part of one (tile < block size):
    each token looks up its own block id, so any power-of-two block size works.
    """
    block_ids = tl.load(block_table_ptr + tokens // BLOCK_SIZE, mask=token_mask, other=0).to(tl.int64)
    rows = block_ids * stride_block + (tokens % BLOCK_SIZE) * stride_token + kv_head * stride_head
    return tl.load(cache_ptr + rows[:, None] + offs_d[None, :], mask=token_mask[:, None], other=0.0)
