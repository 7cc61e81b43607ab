"""int8 / fp8 KV cache kernels against their fp32 references (TRITON_INTERPRET=1 on CPU).

Bounds: against the reference on the SAME quantised cache, fp32 queries agree to 1e-5 relative
(only summation order differs); against fp32 attention on the unquantised K/V, int8 (per token and
head) stays within 3e-2 and fp8 e4m3 (per head, 2x calibration headroom) within 1.5e-1 relative
error on these random inputs: the quantisation error itself, documented in docs/strategies.md.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.kv_quant import reference as ref
from kvpilot.engine.kernels.kv_quant.decode import paged_attention_decode_quant_triton
from kvpilot.engine.kernels.kv_quant.prefill import (
    compact_block_tables,
    dequantize_blocks_triton,
    flat_block_tables,
    paged_attention_prefill_quant,
)
from kvpilot.engine.kernels.kv_quant.store import store_kvcache_quant_triton

pytestmark = pytest.mark.kernels

PAGE = 16
CACHE_DTYPES = {"int8": torch.int8, "fp8": ref.FP8_DTYPE}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def block_tables_for(lens: list[int], num_blocks: int, gen: torch.Generator) -> torch.Tensor:
    """Scattered (permuted) blocks per sequence, -1 padded."""
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    width = max(-(-n // PAGE) for n in lens)
    tables = torch.full((len(lens), width), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(lens):
        count = -(-n // PAGE)
        tables[b, :count] = perm[used : used + count]
        used += count
    return tables


def slots_for(table: torch.Tensor, n: int) -> torch.Tensor:
    pos = torch.arange(n)
    return (table[pos // PAGE].long() * PAGE + pos % PAGE).to(torch.int32)


def make_quant_batch(mode: str, lens: list[int], hkv: int, dim: int, seed: int = 0, scale_dtype=torch.float32):
    """Random K/V per sequence in scattered blocks; returns the 8-bit caches and the fp32 K/V.

    The reference store fills them (the Triton store is checked bit for bit above and costs one
    interpreted program per token and head)."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // PAGE) for n in lens) + 3
    tables = block_tables_for(lens, num_blocks, gen)
    k_cache = torch.zeros(num_blocks, PAGE, hkv, dim, dtype=CACHE_DTYPES[mode])
    v_cache = torch.zeros_like(k_cache)
    keys = [torch.randn(n, hkv, dim, generator=gen) for n in lens]
    values = [torch.randn(n, hkv, dim, generator=gen) for n in lens]
    if mode == "int8":
        k_scale = torch.zeros(num_blocks, PAGE, hkv, dtype=scale_dtype)
        v_scale = torch.zeros_like(k_scale)
    else:
        k_scale = ref.calibrate_fp8_scale(torch.cat(keys))
        v_scale = ref.calibrate_fp8_scale(torch.cat(values))
    for b, n in enumerate(lens):
        ref.store_kvcache_quant_reference(
            keys[b], values[b], k_cache, v_cache, k_scale, v_scale, slots_for(tables[b], n)
        )
    return k_cache, v_cache, k_scale, v_scale, tables, keys, values


@pytest.mark.parametrize("mode", ["int8", "fp8"])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
def test_store_matches_reference_bit_for_bit(mode: str, scale_dtype: torch.dtype) -> None:
    if mode == "fp8" and scale_dtype == torch.float16:
        pytest.skip("fp8 per-head scales are fp32 only")
    gen = torch.Generator().manual_seed(1)
    n, hkv, dim = 9, 3, 40
    key, value = torch.randn(n, hkv, dim, generator=gen) * 3, torch.randn(n, hkv, dim, generator=gen)
    slots = torch.tensor([0, 5, -1, 17, 33, -1, 63, 2, 40], dtype=torch.int32)
    caches = [torch.zeros(4, PAGE, hkv, dim, dtype=CACHE_DTYPES[mode]) for _ in range(4)]
    if mode == "int8":
        scales = [torch.zeros(4, PAGE, hkv, dtype=scale_dtype) for _ in range(4)]
    else:
        ks, vs = ref.calibrate_fp8_scale(key), ref.calibrate_fp8_scale(value)
        scales = [ks, vs, ks.clone(), vs.clone()]
    store_kvcache_quant_triton(key, value, caches[0], caches[1], scales[0], scales[1], slots)
    ref.store_kvcache_quant_reference(key, value, caches[2], caches[3], scales[2], scales[3], slots)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(scales[0], scales[2]) and torch.equal(scales[1], scales[3])
    written = caches[0].view(-1, hkv, dim)[slots[slots >= 0].long()]
    assert written.view(torch.uint8).any(), "the store wrote nothing"
    untouched = torch.ones(4 * PAGE, dtype=torch.bool)
    untouched[slots[slots >= 0].long()] = False
    assert not caches[0].view(-1, hkv, dim)[untouched].view(torch.uint8).any(), "slot -1 rows were written"


def test_fp8_store_saturates_beyond_calibrated_range() -> None:
    x = torch.tensor([[[1.0, -1.0, 1000.0, -1000.0]]])
    scale = torch.tensor([1.0 / 448.0])
    q = ref.quantize_fp8(x, scale).float() * scale
    assert q[0, 0, 2] == pytest.approx(1.0) and q[0, 0, 3] == pytest.approx(-1.0)


@pytest.mark.parametrize("mode", ["int8", "fp8"])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize(("lens", "splits"), [([1, 15, 16], 1), ([17, 63, 300], 3)])
def test_decode_matches_reference(mode: str, group: int, lens: list[int], splits: int) -> None:
    hkv, dim = 2, 32
    k_cache, v_cache, k_scale, v_scale, tables, keys, values = make_quant_batch(mode, lens, hkv, dim, seed=group)
    q = torch.randn(len(lens), hkv * group, dim, generator=torch.Generator().manual_seed(7))
    context = torch.tensor(lens, dtype=torch.int32)
    scale = dim**-0.5
    out = paged_attention_decode_quant_triton(
        q, k_cache, v_cache, k_scale, v_scale, tables, context, scale, num_splits=splits, block_n=32
    )
    same_quant = ref.paged_attention_decode_quant_reference(
        q, k_cache, v_cache, k_scale, v_scale, tables, context, scale, int8_qk=mode == "int8"
    )
    assert rel_err(out, same_quant) < 1e-3  # the default launch multiplies P x V in fp16
    exact = torch.stack([ref.attend_fp32(q[b], keys[b], values[b], scale) for b in range(len(lens))])
    assert rel_err(out, exact) < (3e-2 if mode == "int8" else 1.5e-1)
    for int8_qk in (True, False) if mode == "int8" else (False,):  # fp32 dots: equal to the reference
        fp32 = paged_attention_decode_quant_triton(
            q, k_cache, v_cache, k_scale, v_scale, tables, context, scale, num_splits=splits, block_n=32,
            int8_qk=int8_qk, fp16_dots=False,
        )
        want = ref.paged_attention_decode_quant_reference(
            q, k_cache, v_cache, k_scale, v_scale, tables, context, scale, int8_qk=int8_qk
        )
        assert rel_err(fp32, want) < 1e-5
    if mode == "int8":  # the exact-query path: scores against q itself, K widened
        exact_q = paged_attention_decode_quant_triton(
            q, k_cache, v_cache, k_scale, v_scale, tables, context, scale, num_splits=splits, block_n=32, int8_qk=False
        )
        assert rel_err(exact_q, exact) <= rel_err(out, exact) * 1.5  # q's rounding is the only difference


def test_int8_query_rounding_matches_reference() -> None:
    """The kernel's in-register q quantisation is the reference's, row by row (half away from zero)."""
    q = torch.tensor([[[0.5, -0.5, 1.0, -1.0, 0.25, 0.0, 1.0 / 254, -3.0 / 254]]])
    got = ref.quantize_query_int8(q)
    steps = got / (1.0 / 127)
    assert torch.allclose(steps, torch.tensor([[[64.0, -64.0, 127.0, -127.0, 32.0, 0.0, 1.0, -2.0]]]))
    assert ref.quantize_query_int8(torch.zeros(1, 4)).abs().sum() == 0  # an all-zero row stays zero, no NaN


def test_decode_half_queries_and_16bit_cache() -> None:
    lens, hkv, group, dim = [15, 63], 2, 4, 32
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = make_quant_batch("int8", lens, hkv, dim)
    q = torch.randn(2, hkv * group, dim, generator=torch.Generator().manual_seed(3))
    context = torch.tensor(lens, dtype=torch.int32)
    want = ref.paged_attention_decode_quant_reference(q, k_cache, v_cache, k_scale, v_scale, tables, context, 0.2)
    got = paged_attention_decode_quant_triton(q.half(), k_cache, v_cache, k_scale, v_scale, tables, context, 0.2,
                                              int8_qk=False)
    assert got.dtype == torch.float16 and rel_err(got, want) < 1e-2
    # 16-bit path (no scales): the same kernel on the dequantised cache is the bf16/fp16 baseline.
    k16 = ref.dequantize(k_cache, k_scale).half()
    v16 = ref.dequantize(v_cache, v_scale).half()
    base = paged_attention_decode_quant_triton(q.half(), k16, v16, None, None, tables, context, 0.2, num_splits=2)
    assert rel_err(base, want) < 1e-2


def test_decode_rejects_mismatched_scales() -> None:
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = make_quant_batch("int8", [5], 2, 16)
    q = torch.randn(1, 4, 16)
    with pytest.raises(AssertionError, match="scale caches"):
        paged_attention_decode_quant_triton(
            q, k_cache, v_cache, k_scale[:, :, :1], v_scale, tables, torch.tensor([5], dtype=torch.int32), 0.25
        )


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_dequantize_blocks_kernel_and_prefill_path(mode: str) -> None:
    lens, hkv, group, dim = [17, 40], 2, 2, 32
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = make_quant_batch(mode, lens, hkv, dim, seed=5)
    ids, compact = compact_block_tables(tables)
    assert ids.tolist() == sorted(set(tables[tables >= 0].tolist()))
    assert torch.equal(ids[compact[tables >= 0].long()], tables[tables >= 0])
    got = dequantize_blocks_triton(k_cache, k_scale, ids, torch.float32)
    want = ref.dequantize_blocks_reference(k_cache, k_scale, ids, torch.float32)
    assert torch.equal(got, want)
    # what the prefill path dequantises: one block per table entry, padding (-1) skipped, no host sync
    flat, index = flat_block_tables(tables)
    assert (tables < 0).any() and torch.equal(index >= 0, tables >= 0)
    assert torch.equal(flat[index[tables >= 0].long()], tables[tables >= 0])
    got = dequantize_blocks_triton(k_cache, k_scale, flat, torch.float32)
    valid = flat >= 0
    assert torch.equal(got[valid], ref.dequantize_blocks_reference(k_cache, k_scale, flat, torch.float32)[valid])
    # chunked prefill: the last 5 / 40 tokens of each sequence are the new queries.
    new = [5, 40]
    q = torch.randn(sum(new), hkv * group, dim, generator=torch.Generator().manual_seed(2))
    cu = torch.tensor([0, 5, 45], dtype=torch.int32)
    out = paged_attention_prefill_quant(
        q, k_cache, v_cache, k_scale, v_scale, tables, cu, torch.tensor(lens, dtype=torch.int32), dim**-0.5
    )
    for b, n in enumerate(lens):
        k = ref.gather_dequantized(k_cache, k_scale, tables[b], n)
        v = ref.gather_dequantized(v_cache, v_scale, tables[b], n)
        for i in range(new[b]):
            pos = n - new[b] + i
            want_row = ref.attend_fp32(q[cu[b] + i], k[: pos + 1], v[: pos + 1], dim**-0.5)
            assert rel_err(out[cu[b] + i], want_row) < 1e-5


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_decode_fp16_dots_variant(mode: str) -> None:
    """The fp16-dot path (int8 widened as fp16 x + 1152, offset removed after the dots) agrees too."""
    lens, hkv, group, dim = [1, 17, 130], 2, 4, 32
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = make_quant_batch(mode, lens, hkv, dim, seed=9)
    q = torch.randn(len(lens), hkv * group, dim, generator=torch.Generator().manual_seed(4))
    context = torch.tensor(lens, dtype=torch.int32)
    for int8_qk in (False, True) if mode == "int8" else (False,):
        want = ref.paged_attention_decode_quant_reference(
            q, k_cache, v_cache, k_scale, v_scale, tables, context, 0.2, int8_qk=int8_qk
        )
        for splits in (1, 2):
            got = paged_attention_decode_quant_triton(
                q, k_cache, v_cache, k_scale, v_scale, tables, context, 0.2, num_splits=splits, fp16_dots=True,
                int8_qk=int8_qk,
            )
            assert got.dtype == torch.float32 and rel_err(got, want) < 5e-3


def test_ops_dispatch_between_triton_and_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpilot.engine.kernels.kv_quant import ops

    k_cache, v_cache, k_scale, v_scale, tables, keys, values = make_quant_batch("int8", [20], 2, 16, seed=3)
    q = torch.randn(1, 4, 16)
    context = torch.tensor([20], dtype=torch.int32)
    outs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("KVPILOT_KERNELS", backend)
        caches = (torch.zeros_like(k_cache), torch.zeros_like(v_cache), torch.zeros_like(k_scale), torch.zeros_like(v_scale))
        ops.store_kvcache_quant(keys[0], values[0], *caches, slots_for(tables[0], 20))
        outs[backend] = ops.paged_attention_decode_quant(q, *caches, tables, context, 0.25)
    assert rel_err(outs["triton"], outs["torch"]) < 1e-3  # the kernel multiplies P x V in fp16


def test_int8_scores_need_head_dim_32() -> None:
    """Below head dim 32 (no int8 MMA) both backends keep the exact query; asking for int8 scores is an error."""
    from kvpilot.engine.kernels.kv_quant.qk_policy import int8_scores

    assert int8_scores(torch.int8, 32) and not int8_scores(torch.int8, 16) and not int8_scores(ref.FP8_DTYPE, 128)
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = make_quant_batch("int8", [5], 2, 16)
    with pytest.raises(AssertionError, match="head_dim >= 32"):
        paged_attention_decode_quant_triton(
            torch.randn(1, 4, 16), k_cache, v_cache, k_scale, v_scale, tables, torch.tensor([5], dtype=torch.int32),
            0.25, int8_qk=True,
        )


@pytest.mark.parametrize("mode", ["int8", "fp8"])
@pytest.mark.parametrize(("page", "block_n"), [(8, 16), (8, 64), (32, 16), (32, 64)])
def test_decode_tiles_across_and_within_blocks(mode: str, page: int, block_n: int, monkeypatch) -> None:
    """A tile gathers runs of tokens per paged block: tiles spanning several blocks and tiles inside one."""
    import sys

    monkeypatch.setattr(sys.modules[__name__], "PAGE", page)
    lens, hkv, group, dim = [3, 40, 129], 2, 4, 32
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = make_quant_batch(mode, lens, hkv, dim, seed=page + block_n)
    assert k_cache.shape[1] == page
    q = torch.randn(len(lens), hkv * group, dim, generator=torch.Generator().manual_seed(5))
    context = torch.tensor(lens, dtype=torch.int32)
    for int8_qk in (False, True) if mode == "int8" else (False,):
        want = ref.paged_attention_decode_quant_reference(
            q, k_cache, v_cache, k_scale, v_scale, tables, context, 0.2, int8_qk=int8_qk
        )
        for splits in (1, 3):
            got = paged_attention_decode_quant_triton(
                q, k_cache, v_cache, k_scale, v_scale, tables, context, 0.2, num_splits=splits, block_n=block_n,
                fp16_dots=False, int8_qk=int8_qk,
            )
            assert rel_err(got, want) < 1e-5
