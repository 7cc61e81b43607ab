"""The engine's 8-bit cache layout (kv_quant/layout.py: V dim-major within a block, int8 scales
token-contiguous) against the plain contiguous layout, kernel by kernel (TRITON_INTERPRET=1 on CPU).

The same K/V are stored both ways; every kernel must give the same bytes (store), the same values
(block dequantisation) and the same attention (decode, every gather variant of the launcher).
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.kv_quant import reference as ref
from kvpilot.engine.kernels.kv_quant.decode import paged_attention_decode_quant_triton
from kvpilot.engine.kernels.kv_quant.layout import (
    check_cache_layout,
    is_dim_major,
    is_token_contiguous,
    zeros_dim_major,
    zeros_token_contiguous,
)
from kvpilot.engine.kernels.kv_quant.prefill import dequantize_blocks_triton
from kvpilot.engine.kernels.kv_quant.store import store_kvcache_quant_triton

pytestmark = pytest.mark.kernels

PAGE, HKV, DIM, GROUP = 16, 2, 32, 4
DTYPES = {"int8": torch.int8, "fp8": ref.FP8_DTYPE}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def stored_both_ways(mode: str, lens: list[int], seed: int = 0):
    """(engine-layout caches, contiguous caches, block tables): one Triton store into each."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // PAGE) for n in lens) + 2
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.full((len(lens), max(-(-n // PAGE) for n in lens)), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(lens):
        count = -(-n // PAGE)
        tables[b, :count] = perm[used : used + count]
        used += count
    keys = [torch.randn(n, HKV, DIM, generator=gen) for n in lens]
    values = [torch.randn(n, HKV, DIM, generator=gen) for n in lens]
    engine = [torch.zeros(num_blocks, PAGE, HKV, DIM, dtype=DTYPES[mode]),
              zeros_dim_major((), num_blocks, PAGE, HKV, DIM, DTYPES[mode], "cpu")]
    plain = [torch.zeros(num_blocks, PAGE, HKV, DIM, dtype=DTYPES[mode]) for _ in range(2)]
    if mode == "int8":
        engine += [zeros_token_contiguous((), num_blocks, PAGE, HKV, torch.float32, "cpu") for _ in range(2)]
        plain += [torch.zeros(num_blocks, PAGE, HKV) for _ in range(2)]
    else:
        scales = [ref.calibrate_fp8_scale(torch.cat(x)) for x in (keys, values)]
        engine += scales
        plain += [s.clone() for s in scales]
    for b, n in enumerate(lens):
        pos = torch.arange(n)
        slots = (tables[b][pos // PAGE].long() * PAGE + pos % PAGE).to(torch.int32)
        store_kvcache_quant_triton(keys[b], values[b], *engine, slots)
        store_kvcache_quant_triton(keys[b], values[b], *plain, slots)
    return engine, plain, tables


def test_layout_helpers_and_refusal() -> None:
    v = zeros_dim_major((3,), 5, PAGE, HKV, DIM, torch.int8, "cpu")
    assert v.shape == (3, 5, PAGE, HKV, DIM) and is_dim_major(v[1]) and not v[1].is_contiguous()
    s = zeros_token_contiguous((2,), 5, PAGE, HKV, torch.float32, "cpu")
    assert s.shape == (2, 5, PAGE, HKV) and is_token_contiguous(s[0])
    assert not is_dim_major(torch.zeros(5, PAGE, HKV, DIM))
    with pytest.raises(AssertionError, match="want contiguous or dim-major"):
        check_cache_layout(torch.zeros(5, HKV, PAGE, DIM).transpose(1, 2), "v_cache")


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_store_and_dequantize_agree_across_layouts(mode: str) -> None:
    engine, plain, tables = stored_both_ways(mode, [5, 40])
    for got, want in zip(engine, plain, strict=True):
        assert torch.equal(got.contiguous().view(-1).view(torch.uint8), want.contiguous().view(-1).view(torch.uint8))
    ids = tables[tables >= 0].to(torch.int32)
    for i in (1,):  # V (dim-major) and its scales
        got = dequantize_blocks_triton(engine[i], engine[i + 2], ids, torch.float32)
        want = dequantize_blocks_triton(plain[i], plain[i + 2], ids, torch.float32)
        assert torch.equal(got, want)


VARIANTS = [
    {},  # the defaults: paged V gather on full tiles
    {"v_paged_load": False},
    {"table_ahead": True},
    {"heads_fastest": True},
    {"block_n": 16},
]


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_decode_agrees_across_layouts_and_gather_variants(mode: str) -> None:
    lens = [1, 16, 47, 130]  # single token, one full block, partial tail, several tiles
    engine, plain, tables = stored_both_ways(mode, lens, seed=3)
    q = torch.randn(len(lens), HKV * GROUP, DIM, generator=torch.Generator().manual_seed(9))
    ctx = torch.tensor(lens, dtype=torch.int32)
    want = ref.paged_attention_decode_quant_reference(q, *plain, tables, ctx, DIM**-0.5, int8_qk=mode == "int8")
    bases = {n: paged_attention_decode_quant_triton(q, *plain, tables, ctx, DIM**-0.5, block_n=n, num_splits=2)
             for n in (16, 32)}
    for kw in VARIANTS:
        kw = {"block_n": 32, "num_splits": 2, **kw}
        got = paged_attention_decode_quant_triton(q, *engine, tables, ctx, DIM**-0.5, **kw)
        # only the layout differs: same values, same order (P is rounded to fp16 per tile, so per block_n)
        assert rel_err(got, bases[kw["block_n"]]) < 1e-5, kw
        assert rel_err(got, want) < 1e-3, kw


@pytest.mark.parametrize(
    ("programs", "context", "block_n", "want"),
    [
        (8, 32768, 128, 64),  # batch 1 x 8 KV heads on 132 SMs: 33 wanted -> 64, 128 tiles allow it
        (16, 32768, 128, 32),  # batch 2
        (64, 32768, 128, 8),  # batch 8: 5 wanted -> 8
        (128, 32768, 128, 4),  # batch 16
        (512, 8192, 128, 1),  # batch 64: one program per (sequence, head) already fills two waves
        (8, 1024, 128, 4),  # short context: at least two 128-token tiles per split
        (8, 1024, 64, 8),
        (8, 100, 128, 1),  # less than two tiles: no split
    ],
)
def test_pow2_splits(programs: int, context: int, block_n: int, want: int) -> None:
    from kvpilot.engine.kernels.kv_quant.split_reduce import pow2_splits

    got = pow2_splits(programs, 132, context, block_n)
    assert got == want
    assert got & (got - 1) == 0
