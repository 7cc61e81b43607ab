"""Experiments on the 8-bit paged decode kernel: where does its time go? (device only)

    PYTHONPATH=. python3 bench/kv_quant_variants.py [--batch 64] [--ctx 8192] [--json PATH]
    PYTHONPATH=. python3 bench/kv_quant_variants.py --native      # int8 x int8 / e4m3 score MMAs
    PYTHONPATH=. python3 bench/kv_quant_variants.py --occupancy   # splits x tile x warps x register cap

Llama-3-8B attention shapes (32 q / 8 KV heads, D 128, block 16, shuffled block tables). Every
variant is checked against the fp32 reference before it is timed. Rows:
- `bytes_only`: the same paged gather of K and V tiles with no attention at all (the cache viewed
  as int32 words, XOR-reduced): what the access pattern alone can reach, per cache layout.
- `kernel`: the attention variant; `layout` token-major = [blocks, page, Hkv, D] (the contract),
  head-major = [blocks, Hkv, page, D] (each block's head a contiguous page x D run), passed as a
  strided view so the kernel code is the same; `kt` = scores as K @ q^T (the 8-bit tile is the
  register A operand of the MMA) instead of q @ K^T.

The variant kernels copy the body of kernels/kv_quant/decode.py on purpose: each experiment edits
its own copy, so the shipped kernel never carries experiment switches. Port a winner back by hand.
"""

# Each timing closure is called at once, inside the loop that defines it, so late binding is harmless.
# ruff: noqa: B023
from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from bench.bench_kv_quant import make_cache, reference
from kvpilot.engine.kernels.kv_quant import reference as ref
from kvpilot.engine.kernels.kv_quant.split_reduce import split_reduce

HQ, HKV, D, PAGE = 32, 8, 128, 16


def make(batch: int, ctx: int, mode: str, gen: torch.Generator):
    """These experiments index token-major caches: the layout before session 3 (kv_quant/layout.py)."""
    return make_cache(batch, ctx, mode, gen, layout="contiguous")

LOG2E = 1.4426950408889634
OFFSET: tl.constexpr = tl.constexpr(1152.0)


@triton.jit
def _bytes_only_kernel(k_ptr, v_ptr, bt_ptr, ctx_ptr, out_ptr, stride_bt, s_blk, s_tok, s_head,
                       HKV_: tl.constexpr, WORDS: tl.constexpr, PAGE_: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(ctx_ptr + b)
    per = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per
    end = tl.minimum(start + per, ctx)
    offs_w = tl.arange(0, WORDS)
    acc = tl.zeros([WORDS], tl.int32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        blk = tl.load(bt_ptr + b * stride_bt + offs_n // PAGE_, mask=mask_n, other=0).to(tl.int64)
        row = blk * s_blk + (offs_n % PAGE_) * s_tok + kvh * s_head
        k = tl.load(k_ptr + row[:, None] + offs_w[None, :], mask=mask_n[:, None], other=0)
        v = tl.load(v_ptr + row[:, None] + offs_w[None, :], mask=mask_n[:, None], other=0)
        acc = acc ^ tl.xor_sum(k ^ v, axis=0)
    tl.store(out_ptr + (b * HKV_ + kvh) * NUM_SPLITS * WORDS + split * WORDS + offs_w, acc)


@triton.jit
def _widen(raw, QUANT: tl.constexpr, FP16: tl.constexpr, DTYPE: tl.constexpr):
    if FP16 and QUANT == 1:
        return (raw.to(tl.uint8, bitcast=True).to(tl.uint16) ^ 0x6480).to(tl.float16, bitcast=True)
    if FP16:
        return raw.to(tl.float16)
    return raw.to(DTYPE)


@triton.jit
def _variant_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, ctx_ptr, out_ptr, po_ptr, pl_ptr,
    stride_bt, s_blk, s_tok, s_head, ss_blk, ss_tok, ss_head, qk_scale_log2,
    HKV_: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D_: tl.constexpr, PAGE_: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, QUANT: tl.constexpr, FP16: tl.constexpr, KT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = HKV_ * GROUP
    ctx = tl.load(ctx_ptr + b)
    per = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per
    end = tl.minimum(start + per, ctx)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D_)
    mask_g = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + (b * num_heads + heads[:, None]) * D_ + offs_d[None, :], mask=mask_g[:, None], other=0.0)
    if FP16:
        q = q.to(tl.float16)
    q_sum = tl.sum(q.to(tl.float32), axis=1)
    if QUANT == 2:
        k_hs = tl.load(ks_ptr + kvh)
        v_hs = tl.load(vs_ptr + kvh)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D_], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        blk = tl.load(bt_ptr + b * stride_bt + offs_n // PAGE_, mask=mask_n, other=0).to(tl.int64)
        tok = offs_n % PAGE_
        row = blk * s_blk + tok * s_tok + kvh * s_head
        k = _widen(tl.load(k_ptr + row[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0), QUANT, FP16, q.dtype)
        v = _widen(tl.load(v_ptr + row[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0), QUANT, FP16, q.dtype)
        if KT:
            s = tl.trans(tl.dot(k, tl.trans(q)))
        else:
            s = tl.dot(q, tl.trans(k))
        if FP16 and QUANT == 1:
            s = s - OFFSET * q_sum[:, None]
        if QUANT == 1:
            srow = blk * ss_blk + tok * ss_tok + kvh * ss_head
            s = s * tl.load(ks_ptr + srow, mask=mask_n, other=0.0)[None, :]
            vsc = tl.load(vs_ptr + srow, mask=mask_n, other=0.0)
        if QUANT == 2:
            s = s * k_hs
        s = tl.where(mask_n[None, :], s * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if QUANT == 1:
            p = p * vsc[None, :]
        if QUANT == 2:
            p = p * v_hs
        p = p.to(q.dtype)
        pv = tl.dot(p, v)
        if FP16 and QUANT == 1:
            pv = pv - OFFSET * tl.sum(p.to(tl.float32), axis=1)[:, None]
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / tl.maximum(l_i, 1e-30)[:, None]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + (b * num_heads + heads[:, None]) * D_ + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=mask_g[:, None])
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
        rows = (b * num_heads + heads) * NUM_SPLITS + split
        tl.store(po_ptr + rows[:, None] * D_ + offs_d[None, :], out, mask=mask_g[:, None])
        tl.store(pl_ptr + rows, lse, mask=mask_g)


@triton.jit
def _native_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, ctx_ptr, out_ptr, po_ptr, pl_ptr,
    stride_bt, s_blk, s_tok, s_head, ss_blk, ss_tok, ss_head, qk_scale_log2,
    HKV_: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D_: tl.constexpr, PAGE_: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, QUANT: tl.constexpr, KT: tl.constexpr, PV_T: tl.constexpr,
    PV8: tl.constexpr,
):
    """Scores by an 8-bit MMA: q quantised per head (int8 symmetric / e4m3) against the raw 8-bit K tile."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = HKV_ * GROUP
    ctx = tl.load(ctx_ptr + b)
    per = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per
    end = tl.minimum(start + per, ctx)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D_)
    mask_g = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + (b * num_heads + heads[:, None]) * D_ + offs_d[None, :], mask=mask_g[:, None], other=0.0)
    q = q.to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(q), axis=1), 1e-30)
    if QUANT == 1:
        q_scale = amax / 127.0
        qs = q / q_scale[:, None]
        q8 = tl.where(qs >= 0, qs + 0.5, qs - 0.5).to(tl.int8)
    else:
        q_scale = amax / 448.0
        q8 = (q / q_scale[:, None]).to(tl.float8e4nv)
    if QUANT == 2:
        q_scale = q_scale * tl.load(ks_ptr + kvh)
        v_hs = tl.load(vs_ptr + kvh)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    if PV_T:
        acc = tl.zeros([D_, BLOCK_G], tl.float32)
    else:
        acc = tl.zeros([BLOCK_G, D_], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        blk = tl.load(bt_ptr + b * stride_bt + offs_n // PAGE_, mask=mask_n, other=0).to(tl.int64)
        tok = offs_n % PAGE_
        row = blk * s_blk + tok * s_tok + kvh * s_head
        k = tl.load(k_ptr + row[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        if QUANT == 1:
            if KT:
                s = tl.trans(tl.dot(k, tl.trans(q8), out_dtype=tl.int32)).to(tl.float32)
            else:
                s = tl.dot(q8, tl.trans(k), out_dtype=tl.int32).to(tl.float32)
        else:
            if KT:
                s = tl.trans(tl.dot(k, tl.trans(q8)))
            else:
                s = tl.dot(q8, tl.trans(k))
        s = s * q_scale[:, None]
        if QUANT == 1:
            srow = blk * ss_blk + tok * ss_tok + kvh * ss_head
            s = s * tl.load(ks_ptr + srow, mask=mask_n, other=0.0)[None, :]
            vsc = tl.load(vs_ptr + srow, mask=mask_n, other=0.0)
        s = tl.where(mask_n[None, :], s * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + row[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        if QUANT == 1:
            p = p * vsc[None, :]
            v16 = (v.to(tl.uint8, bitcast=True).to(tl.uint16) ^ 0x6480).to(tl.float16, bitcast=True)
            p16 = p.to(tl.float16)
            corr = OFFSET * tl.sum(p16.to(tl.float32), axis=1)
            if PV_T:
                pv = tl.dot(tl.trans(v16), tl.trans(p16)) - corr[None, :]
            else:
                pv = tl.dot(p16, v16) - corr[:, None]
        else:
            if PV8:
                p8 = (p * 256.0).to(tl.float8e4nv)
                if PV_T:
                    pv = tl.dot(tl.trans(v), tl.trans(p8)) * (v_hs / 256.0)
                else:
                    pv = tl.dot(p8, v) * (v_hs / 256.0)
            else:
                p16 = (p * v_hs).to(tl.float16)
                if PV_T:
                    pv = tl.dot(tl.trans(v.to(tl.float16)), tl.trans(p16))
                else:
                    pv = tl.dot(p16, v.to(tl.float16))
        if PV_T:
            acc = acc * alpha[None, :] + pv
        else:
            acc = acc * alpha[:, None] + pv
        m_i = m_new
    if PV_T:
        acc = tl.trans(acc)
    out = acc / tl.maximum(l_i, 1e-30)[:, None]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + (b * num_heads + heads[:, None]) * D_ + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=mask_g[:, None])
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
        rows = (b * num_heads + heads) * NUM_SPLITS + split
        tl.store(po_ptr + rows[:, None] * D_ + offs_d[None, :], out, mask=mask_g[:, None])
        tl.store(pl_ptr + rows, lse, mask=mask_g)


def decode_native(q, k, v, ks, vs, tables, ctx_lens, *, block_n, splits, warps, stages, kt, pv_t, pv8, maxnreg=None):
    quant = {torch.int8: 1, ref.FP8_DTYPE: 2}[k.dtype]
    batch = q.shape[0]
    out = torch.empty_like(q)
    po = torch.empty(batch, HQ, splits, D, device=q.device, dtype=torch.float32)
    pl = torch.empty(batch, HQ, splits, device=q.device, dtype=torch.float32)
    ss = ks.stride() if quant == 1 else (0, 0, 0)
    kw = {"num_stages": stages} if stages else {}
    if maxnreg:
        kw["maxnreg"] = maxnreg
    _native_kernel[(batch, HKV, splits)](
        q, k, v, ks, vs, tables, ctx_lens, out, po, pl, tables.stride(0), k.stride(0), k.stride(1), k.stride(2),
        ss[0], ss[1], ss[2], D**-0.5 * LOG2E, HKV_=HKV, GROUP=HQ // HKV, BLOCK_G=16, D_=D, PAGE_=PAGE,
        BLOCK_N=block_n, NUM_SPLITS=splits, QUANT=quant, KT=kt, PV_T=pv_t, PV8=pv8 and quant == 2,
        num_warps=warps, **kw)
    if splits > 1:
        split_reduce(po, pl, out)
    return out


@triton.jit
def _tile_int8(k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, b, kvh, n0, end, stride_bt, s_blk, s_tok, s_head,
               ss_blk, ss_tok, ss_head, offs_d, PAGE_: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < end
    blk = tl.load(bt_ptr + b * stride_bt + offs_n // PAGE_, mask=mask_n, other=0).to(tl.int64)
    tok = offs_n % PAGE_
    row = blk * s_blk + tok * s_tok + kvh * s_head
    srow = blk * ss_blk + tok * ss_tok + kvh * ss_head
    k = tl.load(k_ptr + row[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0)
    v = tl.load(v_ptr + row[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0)
    ksc = tl.load(ks_ptr + srow, mask=mask_n, other=0.0)
    vsc = tl.load(vs_ptr + srow, mask=mask_n, other=0.0)
    return k, v, ksc, vsc, mask_n


@triton.jit
def _prefetch_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, ctx_ptr, out_ptr, po_ptr, pl_ptr,
    stride_bt, s_blk, s_tok, s_head, ss_blk, ss_tok, ss_head, qk_scale_log2,
    HKV_: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D_: tl.constexpr, PAGE_: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    """int8 scores + fp16 P x V, with the next tile's K/V/scales loaded before the current tile's math."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = HKV_ * GROUP
    ctx = tl.load(ctx_ptr + b)
    per = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per
    end = tl.minimum(start + per, ctx)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D_)
    mask_g = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + (b * num_heads + heads[:, None]) * D_ + offs_d[None, :], mask=mask_g[:, None], other=0.0)
    q = q.to(tl.float32)
    q_scale = tl.maximum(tl.max(tl.abs(q), axis=1), 1e-30) / 127.0
    qs = q / q_scale[:, None]
    q8 = tl.where(qs >= 0, qs + 0.5, qs - 0.5).to(tl.int8)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D_], tl.float32)
    k, v, ksc, vsc, mask_n = _tile_int8(k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, b, kvh, start, end, stride_bt, s_blk,
                                        s_tok, s_head, ss_blk, ss_tok, ss_head, offs_d, PAGE_, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        k_n, v_n, ksc_n, vsc_n, mask_nn = _tile_int8(k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, b, kvh, n0 + BLOCK_N, end,
                                                     stride_bt, s_blk, s_tok, s_head, ss_blk, ss_tok, ss_head, offs_d,
                                                     PAGE_, BLOCK_N)
        s = tl.dot(q8, tl.trans(k), out_dtype=tl.int32).to(tl.float32) * q_scale[:, None] * ksc[None, :]
        s = tl.where(mask_n[None, :], s * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p16 = (p * vsc[None, :]).to(tl.float16)
        v16 = (v.to(tl.uint8, bitcast=True).to(tl.uint16) ^ 0x6480).to(tl.float16, bitcast=True)
        pv = tl.dot(p16, v16) - OFFSET * tl.sum(p16.to(tl.float32), axis=1)[:, None]
        acc = acc * alpha[:, None] + pv
        m_i = m_new
        k, v, ksc, vsc, mask_n = k_n, v_n, ksc_n, vsc_n, mask_nn
    out = acc / tl.maximum(l_i, 1e-30)[:, None]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + (b * num_heads + heads[:, None]) * D_ + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=mask_g[:, None])
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
        rows = (b * num_heads + heads) * NUM_SPLITS + split
        tl.store(po_ptr + rows[:, None] * D_ + offs_d[None, :], out, mask=mask_g[:, None])
        tl.store(pl_ptr + rows, lse, mask=mask_g)


def decode_prefetch(q, k, v, ks, vs, tables, ctx_lens, *, block_n, splits, warps, maxnreg=None):
    batch = q.shape[0]
    out = torch.empty_like(q)
    po = torch.empty(batch, HQ, splits, D, device=q.device, dtype=torch.float32)
    pl = torch.empty(batch, HQ, splits, device=q.device, dtype=torch.float32)
    kw = {"maxnreg": maxnreg} if maxnreg else {}
    _prefetch_kernel[(batch, HKV, splits)](
        q, k, v, ks, vs, tables, ctx_lens, out, po, pl, tables.stride(0), k.stride(0), k.stride(1), k.stride(2),
        ks.stride(0), ks.stride(1), ks.stride(2), D**-0.5 * LOG2E, HKV_=HKV, GROUP=HQ // HKV, BLOCK_G=16, D_=D,
        PAGE_=PAGE, BLOCK_N=block_n, NUM_SPLITS=splits, num_warps=warps, **kw)
    if splits > 1:
        split_reduce(po, pl, out)
    return out


def to_layout(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """A [blocks, page, Hkv, ...] tensor as the same logical view over the given physical layout."""
    if layout == "token":
        return cache.contiguous()
    return cache.transpose(1, 2).contiguous().transpose(1, 2)  # physical [blocks, Hkv, page, ...]


def decode_variant(q, k, v, ks, vs, tables, ctx_lens, *, block_n, splits, warps, stages, fp16, kt, maxnreg=None):
    quant = {torch.int8: 1, ref.FP8_DTYPE: 2}.get(k.dtype, 0)
    batch = q.shape[0]
    out = torch.empty_like(q)
    po = torch.empty(batch, HQ, splits, D, device=q.device, dtype=torch.float32)
    pl = torch.empty(batch, HQ, splits, device=q.device, dtype=torch.float32)
    ks_t = ks if ks is not None else k
    vs_t = vs if vs is not None else v
    ss = ks.stride() if quant == 1 else (0, 0, 0)
    kw = {"num_stages": stages} if stages else {}
    if maxnreg:
        kw["maxnreg"] = maxnreg
    _variant_kernel[(batch, HKV, splits)](
        q, k, v, ks_t, vs_t, tables, ctx_lens, out, po, pl, tables.stride(0), k.stride(0), k.stride(1), k.stride(2),
        ss[0], ss[1], ss[2], D**-0.5 * LOG2E, HKV_=HKV, GROUP=HQ // HKV, BLOCK_G=16, D_=D, PAGE_=PAGE, BLOCK_N=block_n,
        NUM_SPLITS=splits, QUANT=quant, FP16=fp16 and quant != 0, KT=kt, num_warps=warps, **kw)
    if splits > 1:
        split_reduce(po, pl, out)
    return out


def bytes_only(k, v, tables, ctx_lens, *, block_n, splits, warps):
    kw, vw = k.view(torch.int32), v.view(torch.int32)
    words = kw.shape[-1]
    out = torch.empty(tables.shape[0], HKV, splits, words, dtype=torch.int32, device=k.device)
    _bytes_only_kernel[(tables.shape[0], HKV, splits)](
        kw, vw, tables, ctx_lens, out, tables.stride(0), kw.stride(0), kw.stride(1), kw.stride(2),
        HKV_=HKV, WORDS=words, PAGE_=PAGE, BLOCK_N=block_n, NUM_SPLITS=splits, num_warps=warps)
    return out


def problem(args: argparse.Namespace, mode: str, gen: torch.Generator) -> dict:
    """One cache format's timing problem: caches, tables, q, lengths, bytes to read, reference for 2 rows."""
    k, v, ks, vs, tables = make(args.batch, args.ctx, mode, gen)
    q = torch.randn(args.batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    ctx_lens = torch.full((args.batch,), args.ctx, dtype=torch.int32, device="cuda")
    kv_bytes = 2 * k.numel() * k.element_size() + (2 * ks.numel() * 4 if mode == "int8" else 0)
    want = reference(q[:2], k, v, ks, vs, tables[:2], ctx_lens[:2])
    return {"k": k, "v": v, "ks": ks, "vs": vs, "tables": tables, "q": q, "ctx_lens": ctx_lens,
            "kv_bytes": kv_bytes, "want": want}


def time_case(pr: dict, fn, kw: dict) -> dict:
    """Check fn(q, k, v, ks, vs, tables, ctx_lens, **kw) on two rows against the reference, then time it."""
    args = (pr["k"], pr["v"], pr["ks"], pr["vs"])
    sub = fn(pr["q"][:2], *args, pr["tables"][:2], pr["ctx_lens"][:2], **kw)
    err = float((sub.float() - pr["want"]).norm() / pr["want"].norm())
    ms = do_bench(lambda: fn(pr["q"], *args, pr["tables"], pr["ctx_lens"], **kw), warmup=5, rep=50)
    return {**kw, "us": ms * 1e3, "GB/s": pr["kv_bytes"] / ms / 1e6, "rel_err": err}


def run_cases(pr: dict, mode: str, cases: list) -> list[dict]:
    """Time each (name, fn, kwargs) case on one problem; a case that fails to compile or run is reported and skipped."""
    rows = []
    for name, fn, kw in cases:
        try:
            rows.append({"mode": mode, "what": name, **time_case(pr, fn, kw)})
        except Exception as exc:
            print(f"{mode} {name} {kw} failed: {type(exc).__name__}: {exc}"[:400], flush=True)
    print_best(rows, 12)
    return rows


def dump(args: argparse.Namespace, rows: list[dict]) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def print_best(rows: list[dict], n: int) -> None:
    for r in sorted(rows, key=lambda r: r["us"])[:n]:
        print({a: (round(b, 4) if isinstance(b, float) else b) for a, b in r.items()}, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--json")
    parser.add_argument("--prefetch", action="store_true", help="int8: next tile loaded before this tile's math")
    parser.add_argument("--occupancy", action="store_true", help="sweep splits/tile/warps/register caps")
    parser.add_argument("--native", action="store_true", help="sweep the 8-bit-MMA variants only")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    if args.native:
        return native_sweep(args, gen)
    if args.occupancy:
        return occupancy_sweep(args, gen)
    if args.prefetch:
        return prefetch_sweep(args, gen)
    rows: list[dict] = []
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=100)
    rows.append({"what": "copy 1 GiB", "us": ms * 1e3, "GB/s": 2 * src.numel() / ms / 1e6})
    print(rows[-1], flush=True)
    for mode in ("bf16", "int8", "fp8"):
        k0, v0, ks0, vs0, tables = make(args.batch, args.ctx, mode, gen)
        q = torch.randn(args.batch, HQ, D, device="cuda", dtype=torch.bfloat16)
        ctx_lens = torch.full((args.batch,), args.ctx, dtype=torch.int32, device="cuda")
        kv_bytes = 2 * k0.numel() * k0.element_size() + (2 * ks0.numel() * 4 if mode == "int8" else 0)
        for layout in ("token", "head"):
            k, v = to_layout(k0, layout), to_layout(v0, layout)
            ks = to_layout(ks0, layout) if mode == "int8" else ks0
            vs = to_layout(vs0, layout) if mode == "int8" else vs0
            for block_n, splits, warps in itertools.product((64, 128, 256), (1, 2), (4, 8)):
                try:
                    ms = do_bench(lambda: bytes_only(k, v, tables, ctx_lens, block_n=block_n, splits=splits, warps=warps),
                                  warmup=5, rep=50)
                except Exception as exc:
                    print(f"bytes_only {mode} {layout} {block_n} failed: {type(exc).__name__}: {exc}"[:300])
                    continue
                rows.append({"what": "bytes_only", "mode": mode, "layout": layout, "block_n": block_n, "splits": splits,
                             "warps": warps, "us": ms * 1e3, "GB/s": kv_bytes / ms / 1e6})
            want = None
            combos = list(itertools.product((64, 128), (1, 2), (4, 8), (None,), (False, True), (False, True)))
            combos += [(128, 2, 4, 3, True, kt) for kt in (False, True)] + [(64, 1, 4, 3, False, kt) for kt in (False, True)]
            for block_n, splits, warps, stages, fp16, kt in combos:
                if mode == "bf16" and fp16:
                    continue
                kwargs = dict(block_n=block_n, splits=splits, warps=warps, stages=stages, fp16=fp16, kt=kt)
                try:
                    got = decode_variant(q[:2], k, v, ks, vs, tables[:2], ctx_lens[:2], **kwargs)
                    if want is None:
                        want = reference(q[:2], k0, v0, ks0, vs0, tables[:2], ctx_lens[:2])
                    err = float((got.float() - want).norm() / want.norm())
                    ms = do_bench(lambda: decode_variant(q, k, v, ks, vs, tables, ctx_lens, **kwargs), warmup=5, rep=50)
                except Exception as exc:
                    print(f"kernel {mode} {layout} {kwargs} failed: {type(exc).__name__}: {exc}"[:300])
                    continue
                rows.append({"what": "kernel", "mode": mode, "layout": layout, **kwargs, "us": ms * 1e3,
                             "GB/s": kv_bytes / ms / 1e6, "rel_err": err})
            best = {w: min((r for r in rows if r.get("mode") == mode and r.get("layout") == layout and r["what"] == w),
                           key=lambda r: r["us"], default=None) for w in ("bytes_only", "kernel")}
            print(f"{mode} {layout}: best bytes_only {best['bytes_only']}\n    best kernel {best['kernel']}", flush=True)
        torch.cuda.empty_cache()
    kernels = [r for r in rows if r["what"] == "kernel"]
    for mode in ("bf16", "int8", "fp8"):
        top = sorted((r for r in kernels if r["mode"] == mode), key=lambda r: r["us"])[:8]
        print(f"--- {mode} top 8")
        for r in top:
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def native_sweep(args: argparse.Namespace, gen: torch.Generator) -> None:
    from kvpilot.engine.kernels.kv_quant.decode import paged_attention_decode_quant_triton as lib

    def library(q, k, v, ks, vs, tables, ctx_lens, **kw):
        return lib(q, k, v, ks, vs, tables, ctx_lens, D**-0.5, **kw)

    rows: list[dict] = []
    for mode in ("bf16", "int8", "fp8"):
        pr = problem(args, mode, gen)
        cases = [("library default", library, {})]
        if mode != "bf16":
            cases.append(("library fp16_dots 2 splits", library, {"fp16_dots": True, "num_splits": 2}))
            for block_n, splits, stages, kt, pv_t, pv8 in itertools.product(
                    (64, 128), (1, 2), (None, 3), (False, True), (False, True), (False, True)):
                if pv8 and mode == "int8":
                    continue
                kw = dict(block_n=block_n, splits=splits, warps=4, stages=stages, kt=kt, pv_t=pv_t, pv8=pv8)
                cases.append(("native", decode_native, kw))
        rows += run_cases(pr, mode, cases)
        torch.cuda.empty_cache()
    dump(args, rows)


def occupancy_sweep(args: argparse.Namespace, gen: torch.Generator) -> None:
    """Grid size (splits) against registers per thread (tile, warps, maxnreg): the 8-bit kernel is latency-bound."""
    rows: list[dict] = []
    for mode in ("bf16", "int8", "fp8"):
        pr = problem(args, mode, gen)
        cases = []
        for block_n, warps, splits, maxnreg in itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 4, 8), (None, 128)):
            if block_n * 128 // (warps * 32) < 16:
                continue
            cases.append(("variant", decode_variant, dict(block_n=block_n, splits=splits, warps=warps, stages=None,
                                                          fp16=mode != "bf16", kt=False, maxnreg=maxnreg)))
        if mode == "int8":
            for block_n, warps, splits, maxnreg in itertools.product((64, 128), (4, 8), (1, 2, 4, 8), (None, 128)):
                cases.append(("native", decode_native, dict(block_n=block_n, splits=splits, warps=warps, stages=None,
                                                            kt=False, pv_t=False, pv8=False, maxnreg=maxnreg)))
        rows += run_cases(pr, mode, cases)
        torch.cuda.empty_cache()
    dump(args, rows)


def prefetch_sweep(args: argparse.Namespace, gen: torch.Generator) -> None:
    from kvpilot.engine.kernels.kv_quant.decode import paged_attention_decode_quant_triton as lib

    cases = [("library default", lambda *a: lib(*a, D**-0.5), {})]
    for block_n, warps, splits, maxnreg in itertools.product((64, 128), (2, 4), (2, 4, 8), (None, 168)):
        cases.append(("prefetch", decode_prefetch, dict(block_n=block_n, splits=splits, warps=warps, maxnreg=maxnreg)))
    dump(args, run_cases(problem(args, "int8", gen), "int8", cases))


if __name__ == "__main__":
    main()
