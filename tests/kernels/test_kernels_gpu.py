"""gpu tier: the compiled Triton kernels on CUDA against the fp32 references, at serving-like sizes."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.paged_decode.heuristics import DecodeConfig
from kvpilot.engine.kernels.paged_decode.launcher import paged_attention_decode_triton
from kvpilot.engine.kernels.paged_decode.reference import paged_attention_decode_reference
from kvpilot.engine.kernels.paged_prefill.launcher import paged_attention_prefill_triton
from kvpilot.engine.kernels.paged_prefill.reference import paged_attention_prefill_reference
from kvpilot.engine.kernels.store_kvcache.launcher import store_kvcache_triton
from kvpilot.engine.kernels.store_kvcache.reference import store_kvcache_reference
from tests.kernels.paged_cases import (
    REL_TOL,
    cu_seqlens,
    make_paged_case,
    relative_error,
    slots_for,
    strided_queries,
)

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
LONG_CONTEXTS = [1, 17, 1000, 4097, 16384]


# (dtype, Hq, Hkv, D, block size): every dtype on the benchmark shape, then GQA 1/4/7/8, D 64/256.
DECODE_CASES = [
    *[(dtype, 32, 8, 128, 16) for dtype in DTYPES],
    (torch.bfloat16, 32, 8, 128, 32),
    (torch.bfloat16, 32, 4, 128, 64),
    (torch.bfloat16, 16, 16, 64, 16),
    (torch.float16, 28, 4, 128, 16),
    (torch.bfloat16, 8, 1, 256, 8),
]
PREFILL_CASES = [
    *[(dtype, 32, 8, 128, 16) for dtype in DTYPES],
    (torch.bfloat16, 16, 16, 64, 32),
    (torch.float16, 28, 4, 128, 64),
]


@pytest.mark.parametrize(("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size"), DECODE_CASES)
def test_decode_compiled(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int) -> None:
    case = make_paged_case(LONG_CONTEXTS, num_kv_heads, head_dim, block_size, dtype, device="cuda")
    q = strided_queries(len(LONG_CONTEXTS), num_heads, num_kv_heads, head_dim, dtype, device="cuda")
    scale = head_dim**-0.5
    ref = paged_attention_decode_reference(q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, scale)
    for config in (None, DecodeConfig(num_splits=1), DecodeConfig(num_splits=7, block_n=128 if head_dim <= 128 else 32, num_warps=8)):
        out = paged_attention_decode_triton(q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, scale, config)
        assert relative_error(out, ref) < REL_TOL[dtype], config


@pytest.mark.parametrize(("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size"), PREFILL_CASES)
def test_prefill_compiled(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int) -> None:
    batch = [(2048, 2048), (1500, 300), (4097, 1), (17, 17), (600, 512), (64, 0)]
    context_lens = [c for c, _ in batch]
    q_lens = [n for _, n in batch]
    case = make_paged_case(context_lens, num_kv_heads, head_dim, block_size, dtype, device="cuda")
    q = strided_queries(sum(q_lens), num_heads, num_kv_heads, head_dim, dtype, device="cuda")
    args = (q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens(q_lens, device="cuda"), case.context_lens, head_dim**-0.5)
    ref = paged_attention_prefill_reference(*args)
    for max_seqlen_q in (None, max(q_lens)):
        out = paged_attention_prefill_triton(*args, max_seqlen_q)
        assert relative_error(out, ref) < REL_TOL[dtype], max_seqlen_q


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_compiled(dtype: torch.dtype) -> None:
    context_lens = [4096, 1, 777]
    case = make_paged_case(context_lens, 8, 128, 16, dtype, device="cuda")
    slots = slots_for(case, [list(range(n)) for n in context_lens])
    slots[::5] = -1
    key = torch.randn(len(slots), 8, 128, device="cuda").to(dtype)
    value = torch.randn(len(slots), 8, 128, device="cuda").to(dtype)
    k_ref, v_ref = case.k_cache.clone(), case.v_cache.clone()
    store_kvcache_reference(key, value, k_ref, v_ref, slots)
    store_kvcache_triton(key, value, case.k_cache, case.v_cache, slots)
    assert torch.equal(case.k_cache, k_ref) and torch.equal(case.v_cache, v_ref)
