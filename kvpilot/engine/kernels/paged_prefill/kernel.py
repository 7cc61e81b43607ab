"""Triton kernel: causal varlen prefill attention over paged K/V, GQA group folded into the query rows.

Program (q_tile, seq, kv_head) owns BLOCK_Q query positions x GROUP_PAD query heads of one KV
group (ROWS = BLOCK_Q * GROUP_PAD rows), so each K/V tile is loaded once for the whole group.
The grid is sized from the total token count; tiles past a sequence's chunk exit at once.
"""

from __future__ import annotations

import triton.language as tl

from kvpilot.engine.kernels.interpreter_compat import patch_interpreter
from kvpilot.engine.kernels.paged_gather import _gather_kv_tile
from kvpilot.engine.kernels.specialization import step_kernel

LOG2E = 1.4426950408889634

patch_interpreter()


@step_kernel
def _paged_prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    cu_seqlens_q_ptr,
    context_lens_ptr,
    o_ptr,
    qk_scale_log2,
    window,
    stride_q_token,
    stride_q_head,
    stride_o_token,
    stride_o_head,
    stride_bt_seq,
    stride_cache_block,
    stride_cache_token,
    stride_cache_head,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    q_tile = tl.program_id(0)
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:
        return
    context_len = tl.load(context_lens_ptr + seq)

    ROWS: tl.constexpr = BLOCK_Q * GROUP_PAD
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    q_idx = q_tile * BLOCK_Q + offs_r // GROUP_PAD
    head = kv_head * GROUP + offs_r % GROUP_PAD
    row_mask = (q_idx < q_len) & (offs_r % GROUP_PAD < GROUP)
    q_pos = context_len - q_len + q_idx

    q_rows = (q_start + q_idx).to(tl.int64) * stride_q_token + head * stride_q_head
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_mask[:, None], other=0.0).to(DOT_DTYPE)

    m_i = tl.full([ROWS], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    kv_end = tl.minimum(context_len, context_len - q_len + (q_tile + 1) * BLOCK_Q)
    # sliding window (window 2**30: none): the tile's first query sees keys after its position - window
    kv_start = tl.maximum(context_len - q_len + q_tile * BLOCK_Q - window + 1, 0) // BLOCK_N * BLOCK_N
    for start in range(kv_start, kv_end, BLOCK_N):
        tokens = start + tl.arange(0, BLOCK_N)
        token_mask = tokens < kv_end
        k = _gather_kv_tile(k_cache_ptr, block_table, tokens, token_mask, kv_head, offs_d,
                            stride_cache_block, stride_cache_token, stride_cache_head, BLOCK_SIZE).to(DOT_DTYPE)
        v = _gather_kv_tile(v_cache_ptr, block_table, tokens, token_mask, kv_head, offs_d,
                            stride_cache_block, stride_cache_token, stride_cache_head, BLOCK_SIZE).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        visible = ((tokens[None, :] <= q_pos[:, None]) & (tokens[None, :] > q_pos[:, None] - window)
                   & token_mask[None, :])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = (q_start + q_idx).to(tl.int64) * stride_o_token + head * stride_o_head
    tl.store(o_ptr + o_rows[:, None] + offs_d[None, :], acc.to(o_ptr.dtype.element_ty), mask=row_mask[:, None])
