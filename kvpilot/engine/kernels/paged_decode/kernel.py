"""Triton kernels: GQA-aware split-K paged decode attention (flash-decoding) and its reduction.

`_paged_decode_kernel`, program (seq, kv_head, split): the query heads of one KV group are the
rows of a [GROUP_PAD, D] tile (GROUP_PAD >= 16 so tl.dot applies), so every K/V tile is read
from the paged cache once for the whole group. The program covers one contiguous partition of
the context, BLOCK_N tokens per step (a step gathers BLOCK_N / block_size block ids). With one
split it writes the output; otherwise it writes a normalised partial output and its log2-sum-exp,
and `_paged_decode_reduce_kernel` combines the partials of each (seq, head). With FOLD the combine runs
in the kernel instead: the last split program of each (seq, kv_head) to finish (a ticket, as in
gemv_norm: CTA barrier, acquire-release atomic at GPU scope) combines its group's partials, one launch
fewer per layer (the batch-1 step's reduce launches: docs/benchmarks.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvpilot.engine.kernels.interpreter_compat import patch_interpreter
from kvpilot.engine.kernels.paged_gather import _gather_kv_tile
from kvpilot.engine.kernels.specialization import step_kernel

LOG2E = 1.4426950408889634

patch_interpreter()


@step_kernel
def _paged_decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    o_ptr,
    partial_o_ptr,
    partial_lse_ptr,
    counter_ptr,
    qk_scale_log2,
    window,
    stride_q_seq,
    stride_q_head,
    stride_o_seq,
    stride_o_head,
    stride_bt_seq,
    stride_cache_block,
    stride_cache_token,
    stride_cache_head,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    FOLD: tl.constexpr = False,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    kv_first = tl.maximum(context_len - window, 0)  # sliding window: the last `window` keys (window 2**30: all)
    split_len = tl.cdiv(tl.cdiv(context_len - kv_first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    split_start = kv_first + split * split_len
    split_end = tl.minimum(context_len, split_start + split_len)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    head = kv_head * GROUP + offs_g
    row_mask = offs_g < GROUP
    q_rows = seq.to(tl.int64) * stride_q_seq + head * stride_q_head
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_mask[:, None], other=0.0).to(DOT_DTYPE)

    m_i = tl.full([GROUP_PAD], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for start in range(split_start, split_end, BLOCK_N):
        tokens = start + tl.arange(0, BLOCK_N)
        token_mask = tokens < split_end
        k = _gather_kv_tile(k_cache_ptr, block_table, tokens, token_mask, kv_head, offs_d,
                            stride_cache_block, stride_cache_token, stride_cache_head, BLOCK_SIZE).to(DOT_DTYPE)
        v = _gather_kv_tile(v_cache_ptr, block_table, tokens, token_mask, kv_head, offs_d,
                            stride_cache_block, stride_cache_token, stride_cache_head, BLOCK_SIZE).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        s = tl.where(token_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        o_rows = seq.to(tl.int64) * stride_o_seq + head * stride_o_head
        tl.store(o_ptr + o_rows[:, None] + offs_d[None, :], acc.to(o_ptr.dtype.element_ty), mask=row_mask[:, None])
    else:
        lse = tl.where(l_i > 0, m_i + tl.math.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        partial_rows = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS + split
        tl.store(partial_lse_ptr + partial_rows, lse, mask=row_mask)
        tl.store(partial_o_ptr + partial_rows[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_mask[:, None])
        if FOLD:
            tl.debug_barrier()  # every thread's partial stores before the ticket
            slot = seq * tl.num_programs(1) + kv_head
            ticket = tl.atomic_add(counter_ptr + slot, 1, sem="acq_rel", scope="gpu")
            if ticket == NUM_SPLITS - 1:
                first = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS
                out = _combine_splits(partial_o_ptr, partial_lse_ptr, first, row_mask, offs_d, HEAD_DIM, NUM_SPLITS)
                o_rows = seq.to(tl.int64) * stride_o_seq + head * stride_o_head
                tl.store(o_ptr + o_rows[:, None] + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
                         mask=row_mask[:, None])  # fmt: skip
                tl.store(counter_ptr + slot, 0)


@triton.jit
def _combine_splits(partial_o_ptr, partial_lse_ptr, first, row_mask, offs_d, HEAD_DIM: tl.constexpr,
                    NUM_SPLITS: tl.constexpr):  # fmt: skip
    """The partials of a group's heads (rows `first` + split) weighted by exp2(lse - max lse), as
    _paged_decode_reduce_kernel weighs them; read past L1 (other SMs wrote them)."""
    lse_max = tl.full(first.shape, float("-inf"), dtype=tl.float32)
    for s in range(NUM_SPLITS):  # not unrolled: registers stay the split loop's
        lse = tl.load(partial_lse_ptr + first + s, mask=row_mask, other=float("-inf"), cache_modifier=".cg")
        lse_max = tl.maximum(lse_max, lse)
    lse_max = tl.where(lse_max > float("-inf"), lse_max, 0.0)  # context length 0 (padding): every split empty
    num = tl.zeros([first.shape[0], HEAD_DIM], dtype=tl.float32)
    den = tl.zeros(first.shape, dtype=tl.float32)
    for s in range(NUM_SPLITS):  # not unrolled: registers stay the split loop's
        lse = tl.load(partial_lse_ptr + first + s, mask=row_mask, other=float("-inf"), cache_modifier=".cg")
        w = tl.math.exp2(lse - lse_max)
        part = tl.load(partial_o_ptr + (first + s)[:, None] * HEAD_DIM + offs_d[None, :], mask=row_mask[:, None],
                       other=0.0, cache_modifier=".cg")  # fmt: skip
        num += part * w[:, None]
        den += w
    return num / tl.maximum(den, 1e-30)[:, None]  # 0 when empty


@triton.jit
def _paged_decode_reduce_kernel(
    partial_o_ptr,
    partial_lse_ptr,
    o_ptr,
    stride_o_seq,
    stride_o_head,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    split_mask = offs_s < NUM_SPLITS
    rows = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS + offs_s
    lse = tl.load(partial_lse_ptr + rows, mask=split_mask, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max > float("-inf"), lse_max, 0.0)  # context length 0 (padding): every split empty
    weights = tl.math.exp2(lse - lse_max)
    partial = tl.load(partial_o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=split_mask[:, None], other=0.0)
    out = tl.sum(partial * weights[:, None], axis=0) / tl.maximum(tl.sum(weights, axis=0), 1e-30)  # 0 when empty
    o_rows = seq.to(tl.int64) * stride_o_seq + head * stride_o_head
    tl.store(o_ptr + o_rows + offs_d, out.to(o_ptr.dtype.element_ty))
