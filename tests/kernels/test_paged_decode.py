"""Paged decode (split-K, GQA-aware) against the fp32 torch reference, by relative error."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.paged_decode.heuristics import DecodeConfig
from kvpilot.engine.kernels.paged_decode.launcher import paged_attention_decode_triton
from kvpilot.engine.kernels.paged_decode.reference import paged_attention_decode_reference
from tests.kernels.paged_cases import REL_TOL, make_paged_case, relative_error, strided_queries

pytestmark = pytest.mark.kernels

# Awkward lengths around block and tile boundaries, in one batch.
CONTEXT_LENS = [1, 15, 16, 17, 63, 300]


def run_decode(context_lens: list[int], group: int, num_kv_heads: int, head_dim: int, block_size: int,
               dtype: torch.dtype, config: DecodeConfig | None = None) -> float:
    case = make_paged_case(context_lens, num_kv_heads, head_dim, block_size, dtype)
    q = strided_queries(len(context_lens), group * num_kv_heads, num_kv_heads, head_dim, dtype)
    scale = head_dim**-0.5
    out = paged_attention_decode_triton(q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, scale, config)
    ref = paged_attention_decode_reference(q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, scale)
    assert out.shape == q.shape and out.dtype == dtype
    return relative_error(out, ref)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_shapes(group: int, head_dim: int, block_size: int) -> None:
    num_kv_heads = 2 if group == 1 else 1
    assert run_decode(CONTEXT_LENS, group, num_kv_heads, head_dim, block_size, torch.float32) < REL_TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_half_dtypes(dtype: torch.dtype) -> None:
    assert run_decode(CONTEXT_LENS, 4, 2, 128, 16, dtype) < REL_TOL[dtype]


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("num_splits", [2, 3, 8])
def test_decode_split_k_reduction(num_splits: int, fold: bool) -> None:
    """Splits that leave some partitions empty (short sequences) must not disturb the reduction, in its
    own launch or folded into the split kernel's last program per (seq, kv head)."""
    config = DecodeConfig(num_splits=num_splits, block_n=32, fold_reduce=fold)
    assert run_decode(CONTEXT_LENS, 4, 2, 64, 16, torch.float32, config) < REL_TOL[torch.float32]


def test_the_folded_reduction_equals_the_reduce_launch_and_resets_its_counters() -> None:
    from kvpilot.engine.kernels.tickets import ticket_counters

    case = make_paged_case([0, 5, 40, 300, 129], 2, 64, 16, torch.float32)
    q = strided_queries(5, 6, 2, 64, torch.float32)  # group 3: padded rows in the combine
    args = (q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, 0.125)
    want = paged_attention_decode_triton(*args, DecodeConfig(num_splits=4, block_n=32))
    for _ in range(2):  # the second launch meets the counters the first reset
        got = paged_attention_decode_triton(*args, DecodeConfig(num_splits=4, block_n=32, fold_reduce=True))
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[0], torch.zeros_like(got[0])), "a padding row (context 0) is zeros"
    counters = ticket_counters(q.device, 10)
    assert counters is not None and int(counters.abs().sum()) == 0


@pytest.mark.parametrize(("block_size", "block_n"), [(8, 64), (64, 32), (128, 64)])
def test_decode_block_size_vs_tile(block_size: int, block_n: int) -> None:
    """Tiles spanning several blocks, and blocks larger than one tile."""
    config = DecodeConfig(num_splits=2, block_n=block_n)
    assert run_decode([1, 129, 300], 8, 1, 64, block_size, torch.float32, config) < REL_TOL[torch.float32]


def test_decode_non_power_of_two_group() -> None:
    assert run_decode([17, 63], 3, 2, 64, 16, torch.float32) < REL_TOL[torch.float32]


def test_decode_rejects_bad_block_table_dtype() -> None:
    case = make_paged_case([5], 1, 64, 16, torch.float32)
    q = strided_queries(1, 4, 1, 64, torch.float32)
    with pytest.raises(AssertionError, match="block_tables dtype"):
        paged_attention_decode_triton(q, case.k_cache, case.v_cache, case.block_tables.long(), case.context_lens, 0.125)
