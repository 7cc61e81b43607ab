"""Paged GQA decode attention over an 8-bit (int8 / fp8) or 16-bit KV cache, dequantised in registers.

One program per (sequence, KV head, context split) handles all query heads of the group, so each
K/V tile is loaded once per group. 8-bit tiles are converted to the query dtype in registers (int8
and e4m3 values are exact in bf16/fp16); the scales are folded in exactly in fp32: the K scale
multiplies the scores, the V scale multiplies the probabilities before the PV product.

int8 caches score with an int8 x int8 MMA by default (`int8_qk`): the query rows are quantised
per head in the kernel (symmetric, scale amax/127, as SageAttention does for Q and K), so the K
tile needs no conversion at all; P x V stays a 16-bit product. This adds the query's rounding to
the scores (relative error ~7e-3 of the output on random data against ~2e-3 without it).

What makes the 8-bit kernel fast (session 3, docs/benchmarks.md "8-bit decode, session 3"):
- V is stored dim-major within a block (kv_quant/layout.py), so the P x V operand has tokens
  contiguous; token-major 8-bit V had to be transposed byte by byte through shared memory.
- that V is gathered page by page as [D, pages, PAGE]: each 8-lane phase of a 16-byte load then
  reads one whole 128-byte line.
- full tiles load without masks (only the last, partial tile is masked), int8 -> fp16 widening is
  three PTX instructions per four values, and the scales are folded into the scores and P.
- launch: 128-token tiles, 2 warps, one context split at batch 64 (`LAUNCH`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.interpreter_compat import patch_interpreter
from kvpilot.engine.kernels.kv_quant.layout import (
    check_cache_layout,
    check_scale_layout,
    is_dim_major,
    is_token_contiguous,
)
from kvpilot.engine.kernels.kv_quant.qk_policy import INT8_QK_MIN_HEAD_DIM, int8_scores
from kvpilot.engine.kernels.kv_quant.reference import FP8_DTYPE
from kvpilot.engine.kernels.kv_quant.split_reduce import pow2_splits, split_reduce
from kvpilot.engine.kernels.specialization import step_kernel

QUANT_NONE, QUANT_INT8, QUANT_FP8 = 0, 1, 2
LOG2E = 1.4426950408889634
INT8_FP16_OFFSET_C: tl.constexpr = tl.constexpr(1152.0)

patch_interpreter()




@triton.jit
def _int8_as_fp16(x):
    """int8 -> fp16 holding x + 1152 (INT8_FP16_OFFSET_C), with two integer ops and no int->float conversion.

    fp16 0x6400 is 1024 with a mantissa step of 1, so OR-ing the biased byte (x + 128 = x ^ 0x80)
    into its low bits gives 1024 + x + 128 exactly. I2F/F2F conversions run at a quarter of the
    integer rate, which a decode loop over 8-bit tiles cannot afford.
    """
    return (x.to(tl.uint8, bitcast=True).to(tl.uint16) ^ 0x6480).to(tl.float16, bitcast=True)


@triton.jit
def _int8_as_fp16_ptx(x):
    """`_int8_as_fp16` for CUDA in three instructions per four values: one 32-bit xor biases all four
    bytes, two byte permutes place them under 0x64. (The generic form costs ~1.5 PRMT per value.)"""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t; xor.b32 t, $2, 0x80808080; prmt.b32 $0, t, 0x64646464, 0x5140; "
        "prmt.b32 $1, t, 0x64646464, 0x7362; }",
        "=r,=r,r", [x], dtype=tl.float16, is_pure=True, pack=4,
    )


@triton.jit
def _dot_operand(raw, QUANT: tl.constexpr, FP16_DOT: tl.constexpr, DTYPE: tl.constexpr, PTX: tl.constexpr = False):
    if FP16_DOT and QUANT == 1:
        if PTX:
            return _int8_as_fp16_ptx(raw)
        return _int8_as_fp16(raw)
    return raw.to(DTYPE)


@triton.jit
def _quantize_rows_int8(q):
    """fp32 [G, D] -> (int8 rows, fp32 per-row scale amax/127), rounding half away from zero."""
    q_scale = tl.maximum(tl.max(tl.abs(q), axis=1), 1e-30) / 127.0
    scaled = q / q_scale[:, None]
    return tl.where(scaled >= 0, scaled + 0.5, scaled - 0.5).to(tl.int8), q_scale


@triton.jit
def _attend_tile(
    q, q8, q_row, q_sum, m_i, l_i, acc, n0, end, block, table_row, kvh,
    k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_vd, stride_sb, stride_st, stride_sh,
    k_head_scale, v_head_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    QUANT: tl.constexpr, FP16_DOT: tl.constexpr, INT8_QK: tl.constexpr, V_DIM_MAJOR: tl.constexpr,
    SCALE_TOKEN_CONTIG: tl.constexpr, RUN: tl.constexpr, PTX: tl.constexpr, V_PAGED_LOAD: tl.constexpr,
    MASKED: tl.constexpr,
):
    """One BLOCK_N tile of context (tokens n0..n0+BLOCK_N) folded into the online softmax state.

    MASKED is the last, partial tile only; full tiles load without masks, so the gathers stay
    16-byte vectors (a token mask on dim-major V would split them into bytes).
    """
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_n = offs_n < end
    if MASKED:
        kv_mask = mask_n[:, None] & (offs_d[None, :] < HEAD_DIM)
    slot = offs_n % PAGE
    k_off = (block * stride_kb + slot * stride_kt + kvh * stride_kh)[:, None] + offs_d[None, :]
    v_off = (block * stride_vb + slot * stride_vt + kvh * stride_vh)[:, None] + offs_d[None, :] * stride_vd
    if QUANT == 1:
        s_off = block * stride_sb + slot * stride_st + kvh * stride_sh
        if SCALE_TOKEN_CONTIG:
            s_off = tl.max_contiguous(tl.multiple_of(s_off, RUN), RUN)
        if MASKED:
            k_tok_scale = tl.load(k_scale_ptr + s_off, mask=mask_n, other=0.0).to(tl.float32)
            v_tok_scale = tl.load(v_scale_ptr + s_off, mask=mask_n, other=0.0).to(tl.float32)
        else:
            k_tok_scale = tl.load(k_scale_ptr + s_off).to(tl.float32)
            v_tok_scale = tl.load(v_scale_ptr + s_off).to(tl.float32)
    if MASKED:
        k_raw = tl.load(k_cache_ptr + k_off, mask=kv_mask, other=0.0)
    else:
        k_raw = tl.load(k_cache_ptr + k_off)
    if INT8_QK:
        s = tl.dot(q8, tl.trans(k_raw), out_dtype=tl.int32).to(tl.float32) * q_row[:, None]
    else:
        s = tl.dot(q, tl.trans(_dot_operand(k_raw, QUANT, FP16_DOT, q.dtype)))
        if FP16_DOT and QUANT == 1:
            s = s - INT8_FP16_OFFSET_C * q_sum[:, None]
        s = s * q_row[:, None]
    if QUANT == 1:
        s = s * k_tok_scale[None, :]
    if MASKED:
        s = tl.where(mask_n[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if V_DIM_MAJOR:
        # loaded as V^T [D, N], tokens along the contiguous axis, then transposed for the product:
        # the same shape of access as K (whose loads and shared-memory stores are ideal); an [N, D]
        # tile of dim-major V had twice the L2 sectors and 8x the shared wavefronts (ncu, session 3)
        if MASKED or not V_PAGED_LOAD:
            vt_off = (block * stride_vb + slot * stride_vt + kvh * stride_vh)[None, :] + offs_d[:, None] * stride_vd
            vt_off = tl.max_contiguous(tl.multiple_of(vt_off, [1, RUN]), [1, RUN])
            if MASKED:
                vt_raw = tl.load(v_cache_ptr + vt_off, mask=(offs_d[:, None] < HEAD_DIM) & mask_n[None, :], other=0.0)
            else:
                vt_raw = tl.load(v_cache_ptr + vt_off)
        else:
            # [D, pages, PAGE]: lanes run along D, so each 8-lane phase of a 16-byte load reads one
            # contiguous 128-byte line (along N, 8 lanes hit 8 pages and half-fill 8 sectors)
            offs_p = tl.arange(0, BLOCK_N // PAGE)
            offs_t = tl.arange(0, PAGE)
            page = tl.load(table_row + n0 // PAGE + offs_p).to(tl.int64)
            base = page * stride_vb + kvh * stride_vh
            v3 = base[None, :, None] + offs_d[:, None, None] * stride_vd + offs_t[None, None, :]
            v3 = tl.max_contiguous(tl.multiple_of(v3, [1, 1, PAGE]), [1, 1, PAGE])
            vt_raw = tl.reshape(tl.load(v_cache_ptr + v3), (BLOCK_D, BLOCK_N))
        v = tl.trans(_dot_operand(vt_raw, QUANT, FP16_DOT, q.dtype, PTX))
    else:
        if MASKED:
            v_raw = tl.load(v_cache_ptr + v_off, mask=kv_mask, other=0.0)
        else:
            v_raw = tl.load(v_cache_ptr + v_off)
        v = _dot_operand(v_raw, QUANT, FP16_DOT, q.dtype, PTX)
    if QUANT == 1:
        p = p * v_tok_scale[None, :]
    if QUANT == 2:
        p = p * v_head_scale
    p = p.to(q.dtype)
    pv = tl.dot(p, v)
    if FP16_DOT and QUANT == 1:
        pv = pv - INT8_FP16_OFFSET_C * tl.sum(p.to(tl.float32), axis=1)[:, None]
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _table_tile(table, n0, end, offs_t, PAGE: tl.constexpr):
    """Block ids (int64) of tokens n0 + offs_t; 0 past `end` (never read unmasked)."""
    offs_n = n0 + offs_t
    return tl.load(table + offs_n // PAGE, mask=offs_n < end, other=0).to(tl.int64)


@step_kernel
def _paged_decode_quant_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_o_ptr, part_lse_ptr,
    stride_qb, stride_qh, stride_bt, stride_ob, stride_oh,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_vd, stride_sb, stride_st, stride_sh,
    qk_scale_log2,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, QUANT: tl.constexpr, FP16_DOT: tl.constexpr, INT8_QK: tl.constexpr,
    V_DIM_MAJOR: tl.constexpr, SCALE_TOKEN_CONTIG: tl.constexpr, RUN: tl.constexpr, PTX: tl.constexpr,
    TABLE_AHEAD: tl.constexpr, HEADS_FASTEST: tl.constexpr, V_PAGED_LOAD: tl.constexpr,
):
    if HEADS_FASTEST:  # a sequence's KV heads run side by side: their K rows share DRAM pages
        kvh = tl.program_id(0)
        b = tl.program_id(1)
    else:
        b = tl.program_id(0)
        kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    # every per-row factor of the scores in one multiply: softmax scale (log2 domain) x q's int8 scale
    q_row = tl.full([BLOCK_G], 1.0, tl.float32) * qk_scale_log2
    q8 = q
    if INT8_QK:
        q8, q_scale = _quantize_rows_int8(q.to(tl.float32))
        q_row = q_scale * qk_scale_log2
    q_sum = q_row
    if FP16_DOT:
        q = q.to(tl.float16)
        q_sum = tl.sum(q.to(tl.float32), axis=1)
    k_head_scale = 1.0
    v_head_scale = 1.0
    if QUANT == 2:
        k_head_scale = tl.load(k_scale_ptr + kvh)
        v_head_scale = tl.load(v_scale_ptr + kvh)
        q_row = q_row * k_head_scale

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    table = block_tables_ptr + b * stride_bt
    offs_t = tl.arange(0, BLOCK_N)
    if TABLE_AHEAD:  # the next tile's block ids are loaded a tile ahead, so K/V addresses need no load first
        block = _table_tile(table, start, end, offs_t, PAGE)
    for n0 in range(start, full_end, BLOCK_N):
        if TABLE_AHEAD:
            block_next = _table_tile(table, n0 + BLOCK_N, end, offs_t, PAGE)
        else:
            block = tl.load(table + (n0 + offs_t) // PAGE).to(tl.int64)
        m_i, l_i, acc = _attend_tile(
            q, q8, q_row, q_sum, m_i, l_i, acc, n0, end, block, table, kvh,
            k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
            stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_vd, stride_sb, stride_st, stride_sh,
            k_head_scale, v_head_scale, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, QUANT, FP16_DOT, INT8_QK, V_DIM_MAJOR,
            SCALE_TOKEN_CONTIG, RUN, PTX, V_PAGED_LOAD, False,
        )
        if TABLE_AHEAD:
            block = block_next
    if full_end < end:
        if not TABLE_AHEAD:
            block = _table_tile(table, full_end, end, offs_t, PAGE)
        m_i, l_i, acc = _attend_tile(
            q, q8, q_row, q_sum, m_i, l_i, acc, full_end, end, block, table, kvh,
            k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
            stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_vd, stride_sb, stride_st, stride_sh,
            k_head_scale, v_head_scale, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, QUANT, FP16_DOT, INT8_QK, V_DIM_MAJOR,
            SCALE_TOKEN_CONTIG, RUN, PTX, V_PAGED_LOAD, True,
        )

    out = acc / tl.maximum(l_i, 1e-30)[:, None]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=mask_g[:, None] & mask_d[None, :])
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
        tl.store(part_o_ptr + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + offs_d[None, :],
                 out, mask=mask_g[:, None] & mask_d[None, :])
        tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=mask_g)


def _quant_mode(k_cache: torch.Tensor, q: torch.Tensor) -> int:
    if k_cache.dtype == torch.int8:
        return QUANT_INT8
    if k_cache.dtype == FP8_DTYPE:
        return QUANT_FP8
    assert k_cache.dtype == q.dtype, f"16-bit cache dtype {k_cache.dtype} must match q dtype {q.dtype}"
    return QUANT_NONE


class Launch(NamedTuple):
    """Launch defaults of one cache format."""

    block_n: int
    num_warps: int
    maxnreg: int | None  # register cap per thread (None: the compiler's choice)
    waves: int  # programs per SM the context splits aim for
    num_stages: int | None
    fp16_dots: bool
    int8_qk: bool
    v_paged_load: bool  # dim-major V gathered page by page (see _attend_tile)


# From the H200 sweeps in docs/benchmarks.md ("8-bit decode, session 3"): batch 64, Llama-3-8B shapes,
# contexts 1024 and 8192; the 8-bit rows were the fastest of 40+ launches at both contexts.
LAUNCH = {
    QUANT_NONE: Launch(64, 4, None, 2, None, False, False, False),
    QUANT_INT8: Launch(128, 2, None, 2, 2, True, True, True),
    QUANT_FP8: Launch(128, 2, None, 2, 2, True, False, True),
}


def paged_attention_decode_quant_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    fp16_dots: bool | None = None,
    int8_qk: bool | None = None,
    maxnreg: int | None = None,
    table_ahead: bool = False,
    heads_fastest: bool = False,
    v_paged_load: bool | None = None,
) -> torch.Tensor:
    """q [B, Hq, D] at position context_lens[b]-1 over an int8/fp8 (or 16-bit, scales None) paged cache.

    Arguments left None take the measured defaults of `LAUNCH` for the cache format. table_ahead,
    heads_fastest and v_paged_load are launch variants kept for the sweeps (bench/bench_kv_quant.py).
    fp16_dots (8-bit caches only): run the products in fp16 (q converted once per program), with
    int8 tiles widened by `_int8_as_fp16` and fp8 by the hardware e4m3->f16 conversion, instead of
    converting every tile to bf16 through fp32. int8_qk (int8 caches only): scores by an int8 MMA
    against a per-head int8 quantisation of q (see the module docstring); False keeps q exact.
    maxnreg caps registers per thread on CUDA (more resident programs per SM).
    """
    tensors = [t for t in (q, k_cache, v_cache, k_scale, v_scale, block_tables, context_lens) if t is not None]
    check_triton_device(*tensors)
    quant = _quant_mode(k_cache, q)
    assert v_cache.dtype == k_cache.dtype and v_cache.shape == k_cache.shape, "k/v caches must match"
    assert q.dim() == 3 and q.stride(-1) == 1, f"q must be [B, Hq, D] with contiguous D, got {tuple(q.shape)}"
    batch, num_heads, head_dim = q.shape
    _, page, num_kv_heads, cache_dim = k_cache.shape
    assert cache_dim == head_dim and num_heads % num_kv_heads == 0, (
        f"cache [.., .., Hkv={num_kv_heads}, D={cache_dim}] incompatible with q heads {num_heads}, D {head_dim}"
    )
    assert k_cache.is_contiguous(), f"k_cache must be contiguous, got strides {k_cache.stride()}"
    check_cache_layout(v_cache, "v_cache")
    assert q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"q dtype {q.dtype} not supported"
    if quant == QUANT_INT8:
        assert k_scale is not None and v_scale is not None and k_scale.shape == k_cache.shape[:3], (
            f"int8 cache needs scale caches {tuple(k_cache.shape[:3])}"
        )
        assert v_scale.shape == k_scale.shape and v_scale.stride() == k_scale.stride(), "k/v scale caches must match"
        check_scale_layout(k_scale, "k_scale")
    elif quant == QUANT_FP8:
        assert k_scale is not None and v_scale is not None, "fp8 cache needs per-head scales [Hkv]"
        assert k_scale.shape == (num_kv_heads,) and v_scale.shape == (num_kv_heads,)
        assert k_scale.dtype == torch.float32 and v_scale.dtype == torch.float32, "fp8 scales must be fp32"
    assert block_tables.dtype == torch.int32 and block_tables.dim() == 2 and block_tables.shape[0] == batch
    assert block_tables.stride(1) == 1, "block_tables rows must be contiguous"
    assert context_lens.dtype == torch.int32 and context_lens.shape == (batch,)
    group = num_heads // num_kv_heads
    d = LAUNCH[quant]
    block_n = d.block_n if block_n is None else block_n
    maxnreg = d.maxnreg if maxnreg is None else maxnreg
    num_warps = d.num_warps if num_warps is None else num_warps
    num_stages = d.num_stages if num_stages is None else num_stages
    fp16_dots = d.fp16_dots if fp16_dots is None else fp16_dots
    v_paged_load = d.v_paged_load if v_paged_load is None else v_paged_load
    int8_qk = d.int8_qk and int8_scores(k_cache.dtype, head_dim) if int8_qk is None else int8_qk
    assert not int8_qk or int8_scores(k_cache.dtype, head_dim), (
        f"int8_qk needs an int8 cache and head_dim >= {INT8_QK_MIN_HEAD_DIM}, got {k_cache.dtype}, {head_dim}"
    )
    if num_splits is None:
        num_splits = 1
        if q.is_cuda:
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            num_splits = pow2_splits(batch * num_kv_heads, sms, block_tables.shape[1] * page, block_n, waves=d.waves)
    out = torch.empty_like(q)
    if batch == 0:
        return out
    if num_splits > 1:
        part_o = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out
    k_s = k_scale if k_scale is not None else k_cache
    stages = {} if num_stages is None else {"num_stages": num_stages}
    if maxnreg and q.is_cuda:
        stages["maxnreg"] = maxnreg
    v_s = v_scale if v_scale is not None else v_cache
    scale_strides = k_scale.stride() if quant == QUANT_INT8 else (0, 0, 0)
    grid = (num_kv_heads, batch, num_splits) if heads_fastest else (batch, num_kv_heads, num_splits)
    _paged_decode_quant_kernel[grid](
        q, k_cache, v_cache, k_s, v_s, block_tables, context_lens, out, part_o, part_lse,
        q.stride(0), q.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
        part_o.stride(0), part_o.stride(1), part_o.stride(2) if num_splits > 1 else 0,
        part_lse.stride(0), part_lse.stride(1),
        *k_cache.stride()[:3], *v_cache.stride(), *scale_strides,
        scale * LOG2E,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), PAGE=page, BLOCK_N=block_n,
        NUM_SPLITS=num_splits, QUANT=quant, FP16_DOT=fp16_dots and quant != QUANT_NONE, INT8_QK=int8_qk,
        V_DIM_MAJOR=is_dim_major(v_cache) and page % 16 == 0 and block_n % 16 == 0,
        SCALE_TOKEN_CONTIG=quant == QUANT_INT8 and is_token_contiguous(k_scale) and page % 4 == 0 and block_n % 4 == 0,
        RUN=min(page, block_n), PTX=q.is_cuda, TABLE_AHEAD=table_ahead, HEADS_FASTEST=heads_fastest,
        V_PAGED_LOAD=v_paged_load and is_dim_major(v_cache) and page % 16 == 0 and block_n % page == 0,
        num_warps=num_warps, **stages,
    )
    if num_splits > 1:
        split_reduce(part_o, part_lse, out)
    return out
