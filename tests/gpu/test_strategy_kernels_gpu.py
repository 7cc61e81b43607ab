"""The strategy kernels compiled on CUDA (bf16 where the engine uses it), against their fp32 references.

Bounds: bf16 inputs 3e-2 relative (probabilities and products rounded to bf16 before the tensor-core
dots); fp32 decode of lightning attention 1e-5 (no dots); fp32 lightning prefill 5e-3 (tl.dot runs
in tf32 on fp32 inputs).
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.kv_quant import reference as kvref
from kvpilot.engine.kernels.lightning_attn import reference as laref
from kvpilot.engine.kernels.mla_decode import reference as mlaref

pytestmark = pytest.mark.gpu

PAGE = 16
DEV = "cuda"


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def tables_for(lens: list[int], gen: torch.Generator) -> tuple[torch.Tensor, int]:
    num_blocks = sum(-(-n // PAGE) for n in lens) + 4
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.full((len(lens), max(-(-n // PAGE) for n in lens)), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(lens):
        c = -(-n // PAGE)
        tables[b, :c] = perm[used : used + c]
        used += c
    return tables.to(DEV), num_blocks


def slots_for(table: torch.Tensor, n: int) -> torch.Tensor:
    pos = torch.arange(n, device=table.device)
    return (table[pos // PAGE].long() * PAGE + pos % PAGE).to(torch.int32)


@pytest.mark.parametrize("mode", ["int8", "fp8"])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_quant_store_and_decode(mode: str, group: int) -> None:
    from kvpilot.engine.kernels.kv_quant.decode import paged_attention_decode_quant_triton
    from kvpilot.engine.kernels.kv_quant.store import store_kvcache_quant_triton

    gen = torch.Generator().manual_seed(group)
    lens, hkv, dim = [1, 17, 300, 1000], 2, 128
    tables, num_blocks = tables_for(lens, gen)
    dtype = torch.int8 if mode == "int8" else kvref.FP8_DTYPE
    caches = [torch.zeros(num_blocks, PAGE, hkv, dim, dtype=dtype, device=DEV) for _ in range(4)]
    keys = [torch.randn(n, hkv, dim, generator=gen).to(DEV, torch.bfloat16) for n in lens]
    values = [torch.randn(n, hkv, dim, generator=gen).to(DEV, torch.bfloat16) for n in lens]
    if mode == "int8":
        scales = [torch.zeros(num_blocks, PAGE, hkv, device=DEV) for _ in range(4)]
    else:
        ks, vs = kvref.calibrate_fp8_scale(torch.cat(keys)), kvref.calibrate_fp8_scale(torch.cat(values))
        scales = [ks, vs, ks.clone(), vs.clone()]
    for b, n in enumerate(lens):
        slots = slots_for(tables[b], n)
        store_kvcache_quant_triton(keys[b], values[b], caches[0], caches[1], scales[0], scales[1], slots)
        kvref.store_kvcache_quant_reference(keys[b], values[b], caches[2], caches[3], scales[2], scales[3], slots)
    # Equal as values: the only byte difference seen on the H200 was fp8 -0 vs +0 for a tiny
    # negative input that rounds to zero (dequantised gap 0.0).
    differ = caches[0].float() != caches[2].float()
    assert not differ.any(), (
        f"{int(differ.sum())} of {differ.numel()} bytes differ; max dequantised gap "
        f"{float((caches[0].float() - caches[2].float()).abs().max())} (in quantisation steps for int8)"
    )
    assert torch.equal(scales[0], scales[2])
    q = torch.randn(len(lens), hkv * group, dim, generator=gen).to(DEV, torch.bfloat16)
    ctx = torch.tensor(lens, dtype=torch.int32, device=DEV)
    for splits, fp16_dots in ((1, False), (4, False), (1, True), (4, True)):
        out = paged_attention_decode_quant_triton(q, caches[0], caches[1], scales[0], scales[1], tables, ctx, dim**-0.5,
                                                  num_splits=splits, fp16_dots=fp16_dots)
        want = kvref.paged_attention_decode_quant_reference(q.float(), caches[0], caches[1], scales[0], scales[1],
                                                            tables, ctx, dim**-0.5)
        assert rel_err(out, want) < 3e-2


def test_quant_prefill_path() -> None:
    from kvpilot.engine.kernels.kv_quant.prefill import (
        compact_block_tables,
        dequantize_blocks_triton,
        paged_attention_prefill_quant,
    )

    gen = torch.Generator().manual_seed(0)
    lens, hkv, dim = [33, 200], 2, 64
    tables, num_blocks = tables_for(lens, gen)
    k_cache = torch.randint(-127, 128, (num_blocks, PAGE, hkv, dim), dtype=torch.int8, generator=gen).to(DEV)
    v_cache = torch.randint(-127, 128, (num_blocks, PAGE, hkv, dim), dtype=torch.int8, generator=gen).to(DEV)
    k_scale = (torch.rand(num_blocks, PAGE, hkv, generator=gen) / 100).to(DEV)
    v_scale = (torch.rand(num_blocks, PAGE, hkv, generator=gen) / 100).to(DEV)
    ids, _ = compact_block_tables(tables)
    got = dequantize_blocks_triton(k_cache, k_scale, ids, torch.float32)
    assert torch.equal(got, kvref.dequantize_blocks_reference(k_cache, k_scale, ids, torch.float32))
    q = torch.randn(8 + 200, hkv * 4, dim, generator=gen).to(DEV, torch.bfloat16)
    cu = torch.tensor([0, 8, 208], dtype=torch.int32, device=DEV)
    out = paged_attention_prefill_quant(q, k_cache, v_cache, k_scale, v_scale, tables, cu,
                                        torch.tensor(lens, dtype=torch.int32, device=DEV), dim**-0.5)
    k = kvref.gather_dequantized(k_cache, k_scale, tables[1], 200)
    v = kvref.gather_dequantized(v_cache, v_scale, tables[1], 200)
    want = torch.stack([kvref.attend_fp32(q[8 + i].float(), k[: i + 1], v[: i + 1], dim**-0.5) for i in range(200)])
    assert rel_err(out[8:], want) < 3e-2


@pytest.mark.parametrize("heads", [16, 128])
def test_mla_decode(heads: int) -> None:
    from kvpilot.engine.kernels.mla_decode.kernel import mla_decode_triton

    gen = torch.Generator().manual_seed(heads)
    lens, rank, rope = [1, 63, 300, 2000], 512, 64
    tables, num_blocks = tables_for(lens, gen)
    cache = torch.randn(num_blocks, PAGE, rank + rope, generator=gen).to(DEV, torch.bfloat16)
    q_lat = (torch.randn(len(lens), heads, rank, generator=gen) * 0.05).to(DEV, torch.bfloat16)
    q_pe = torch.randn(len(lens), heads, rope, generator=gen).to(DEV, torch.bfloat16)
    ctx = torch.tensor(lens, dtype=torch.int32, device=DEV)
    want = mlaref.mla_decode_reference(q_lat, q_pe, cache, tables, ctx, 0.07)
    for splits in (1, 5):
        got = mla_decode_triton(q_lat, q_pe, cache, tables, ctx, 0.07, num_splits=splits)
        assert rel_err(got, want) < 3e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lightning_prefill_and_decode(dtype: torch.dtype) -> None:
    from kvpilot.engine.kernels.lightning_attn.decode import lightning_decode_triton
    from kvpilot.engine.kernels.lightning_attn.prefill import lightning_prefill_triton

    gen = torch.Generator().manual_seed(0)
    lens, heads, dim = [1, 63, 64, 300], 8, 128
    total = sum(lens)
    q, k, v = ((torch.randn(total, heads, dim, generator=gen) * 0.1).to(DEV, dtype) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    slopes = laref.minimax_slopes(heads, 3, 8).to(DEV)
    pool = torch.zeros(6, heads, dim, dim, device=DEV)
    want_pool = pool.clone()
    slots = torch.tensor([5, 0, 2, 3], dtype=torch.int32, device=DEV)
    got = lightning_prefill_triton(q, k, v, cu, slopes, pool, slots)
    want = laref.lightning_prefill_reference(q, k, v, cu, slopes, want_pool, slots)
    bound = 5e-3 if dtype == torch.float32 else 3e-2
    assert rel_err(got, want) < bound and rel_err(pool, want_pool) < bound
    qd, kd, vd = ((torch.randn(4, heads, dim, generator=gen) * 0.1).to(DEV, dtype) for _ in range(3))
    pool_ref = pool.clone()
    got = lightning_decode_triton(qd, kd, vd, slopes, pool, slots)
    want = laref.lightning_decode_reference(qd, kd, vd, slopes, pool_ref, slots)
    assert rel_err(got, want) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert rel_err(pool, pool_ref) < 1e-5


def test_mla_store_latent() -> None:
    from kvpilot.engine.kernels.mla_decode.store import store_latent_reference, store_latent_triton

    c_kv = torch.randn(40, 512, device=DEV, dtype=torch.bfloat16)
    k_pe = torch.randn(40, 64, device=DEV, dtype=torch.bfloat16)
    slots = torch.randperm(64, device=DEV)[:40].to(torch.int32)
    slots[::7] = -1
    got = torch.zeros(4, PAGE, 576, device=DEV, dtype=torch.bfloat16)
    want = torch.zeros_like(got)
    store_latent_triton(c_kv, k_pe, got, slots)
    store_latent_reference(c_kv, k_pe, want, slots)
    assert torch.equal(got, want)
