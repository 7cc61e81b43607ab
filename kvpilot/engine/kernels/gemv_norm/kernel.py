"""Triton: GEMV over weight-row blocks and K splits; the last program of a row runs the add + RMSNorm.

Program (n_block, split, row) reduces BLOCK_N weight rows over its share of K into fp32 partials
[row, split, n]. It then takes a ticket (atomic add on the row's counter, acquire-release at GPU
scope, after a CTA barrier: every thread's partial stores are ordered before it, the CUTLASS
semaphore pattern). The program that draws the last ticket sums the row's partials in split order
(deterministic: no floating-point atomics), rounds y to the activation dtype as F.linear's output is,
runs add_rmsnorm_row over the whole row, and resets the counter to 0 for the next launch (a CUDA
graph replays the same counters).

SPLIT_EPILOGUE (session 18, unmeasured): the epilogue in two levels, so that the last program does less
alone. The last K split of each weight-row block (a ticket per (row, block)) sums that block's partials,
adds the residual and stores the block's sum of squares; the last block of the row (the row's ticket)
sums those in block order (deterministic) and only scales the stored sum by rstd and the norm weight.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvpilot.engine.kernels.interpreter_compat import patch_interpreter
from kvpilot.engine.kernels.rmsnorm.kernel import add_rmsnorm_row
from kvpilot.engine.kernels.silu_mul.kernel import silu_mul_values

patch_interpreter()


@triton.jit
def _gemv_norm_kernel(
    x_ptr, w_ptr, res_ptr, norm_w_ptr, out_ptr, sum_ptr, partial_ptr, counter_ptr,
    eps, N, K,
    stride_x, stride_w, stride_r, stride_o, stride_s,
    SILU_INPUT: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_ROW: tl.constexpr, SPLIT_EPILOGUE: tl.constexpr = False, BLOCK_BLOCKS: tl.constexpr = 1,
    block_sq_ptr=None, block_counter_ptr=None,
):  # fmt: skip
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    row = tl.program_id(2)
    dtype = out_ptr.dtype.element_ty
    n_offs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n_offs < N
    k_len = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = split * k_len
    k_end = tl.minimum(K, k_start + k_len)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    w_rows = w_ptr + n_offs[:, None].to(tl.int64) * stride_w
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        k_mask = ks < k_end
        if SILU_INPUT:  # x row = [gate (K) | up (K)]
            g = tl.load(x_row + ks, mask=k_mask, other=0.0).to(tl.float32)
            u = tl.load(x_row + K + ks, mask=k_mask, other=0.0).to(tl.float32)
            xv = silu_mul_values(g, u, dtype).to(tl.float32)
        else:
            xv = tl.load(x_row + ks, mask=k_mask, other=0.0).to(tl.float32)
        w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc += w.to(tl.float32) * xv[None, :]
    partial_row = partial_ptr + (row.to(tl.int64) * SPLIT_K + split) * N
    tl.store(partial_row + n_offs, tl.sum(acc, axis=1), mask=n_mask)

    tl.debug_barrier()  # every thread's partial stores before the ticket
    if SPLIT_EPILOGUE:
        _block_then_row_epilogue(partial_ptr, res_ptr, norm_w_ptr, out_ptr, sum_ptr, counter_ptr, block_sq_ptr,
                                 block_counter_ptr, eps, N, stride_r, stride_o, stride_s, row, pid_n, n_offs,
                                 n_mask, SPLIT_K, BLOCK_N, BLOCK_ROW, BLOCK_BLOCKS)  # fmt: skip
    else:
        ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
        if ticket == tl.num_programs(0) * SPLIT_K - 1:
            cols = tl.arange(0, BLOCK_ROW)
            mask = cols < N
            y = tl.zeros([BLOCK_ROW], dtype=tl.float32)
            first = partial_ptr + row.to(tl.int64) * SPLIT_K * N
            for s in tl.static_range(SPLIT_K):  # split order: the same sum every launch
                y += tl.load(first + s * N + cols, mask=mask, other=0.0, cache_modifier=".cg")
            r = row.to(tl.int64)
            add_rmsnorm_row(y.to(dtype), res_ptr + r * stride_r, norm_w_ptr, out_ptr + r * stride_o,
                            sum_ptr + r * stride_s, eps, N, cols, mask, True)  # fmt: skip
            tl.store(counter_ptr + row, 0)


@triton.jit
def _block_then_row_epilogue(
    partial_ptr, res_ptr, norm_w_ptr, out_ptr, sum_ptr, counter_ptr, block_sq_ptr, block_counter_ptr,
    eps, N, stride_r, stride_o, stride_s, row, pid_n, n_offs, n_mask,
    SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_ROW: tl.constexpr, BLOCK_BLOCKS: tl.constexpr,
):  # fmt: skip
    """SPLIT_EPILOGUE: the block's add + sum of squares by its last K split, the row's scaling by its last block."""
    n_blocks = tl.num_programs(0)
    dtype = out_ptr.dtype.element_ty
    r = row.to(tl.int64)
    slot = r * n_blocks + pid_n
    split_ticket = tl.atomic_add(block_counter_ptr + slot, 1, sem="acq_rel", scope="gpu")
    if split_ticket == SPLIT_K - 1:
        first = partial_ptr + r * SPLIT_K * N
        y = tl.zeros([BLOCK_N], dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):  # split order: the same sum every launch
            y += tl.load(first + s * N + n_offs, mask=n_mask, other=0.0, cache_modifier=".cg")
        res = tl.load(res_ptr + r * stride_r + n_offs, mask=n_mask, other=0.0).to(tl.float32)
        total = (y.to(dtype).to(tl.float32) + res).to(sum_ptr.dtype.element_ty)  # rounded as add_rmsnorm_row
        tl.store(sum_ptr + r * stride_s + n_offs, total, mask=n_mask)
        h = total.to(tl.float32)
        tl.store(block_sq_ptr + slot, tl.sum(h * h, axis=0))
        tl.store(block_counter_ptr + slot, 0)
        tl.debug_barrier()  # the block's sum and its sum of squares before the row's ticket
        row_ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
        if row_ticket == n_blocks - 1:
            blocks = tl.arange(0, BLOCK_BLOCKS)
            sq = tl.load(block_sq_ptr + r * n_blocks + blocks, mask=blocks < n_blocks, other=0.0, cache_modifier=".cg")
            rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / N + eps)
            cols = tl.arange(0, BLOCK_ROW)
            mask = cols < N
            row_sum = tl.load(sum_ptr + r * stride_s + cols, mask=mask, other=0.0, cache_modifier=".cg")
            normed = (row_sum.to(tl.float32) * rstd).to(dtype).to(tl.float32)  # rounded before the weight, as the reference
            w = tl.load(norm_w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_ptr + r * stride_o + cols, (w * normed).to(dtype), mask=mask)
            tl.store(counter_ptr + row, 0)
