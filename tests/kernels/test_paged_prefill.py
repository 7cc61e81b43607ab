"""Paged prefill (varlen, causal, cached prefix + new chunk) against the fp32 torch reference."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.paged_prefill.launcher import paged_attention_prefill_triton
from kvpilot.engine.kernels.paged_prefill.reference import paged_attention_prefill_reference
from tests.kernels.paged_cases import REL_TOL, cu_seqlens, make_paged_case, relative_error, strided_queries

pytestmark = pytest.mark.kernels

# (context length, new-chunk length) per sequence of one packed batch: a first chunk with no
# prefix, chunks after cached prefixes ending on/off block boundaries, single-token chunks.
MIXED_BATCH = [(17, 17), (63, 15), (300, 1), (1, 1), (32, 16), (16, 15)]


def run_prefill(batch: list[tuple[int, int]], group: int, num_kv_heads: int, head_dim: int, block_size: int,
                dtype: torch.dtype, *, pass_max_seqlen: bool = False) -> float:
    context_lens = [context for context, _ in batch]
    q_lens = [chunk for _, chunk in batch]
    case = make_paged_case(context_lens, num_kv_heads, head_dim, block_size, dtype)
    q = strided_queries(sum(q_lens), group * num_kv_heads, num_kv_heads, head_dim, dtype)
    cu = cu_seqlens(q_lens, device=str(q.device))
    scale = head_dim**-0.5
    args = (q, case.k_cache, case.v_cache, case.block_tables, cu, case.context_lens, scale)
    out = paged_attention_prefill_triton(*args, max(q_lens) if pass_max_seqlen else None)
    ref = paged_attention_prefill_reference(*args)
    assert out.shape == q.shape and out.dtype == dtype
    return relative_error(out, ref)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_prefill_mixed_batch(group: int, head_dim: int, block_size: int) -> None:
    num_kv_heads = 2 if group == 1 else 1
    err = run_prefill(MIXED_BATCH, group, num_kv_heads, head_dim, block_size, torch.float32, pass_max_seqlen=group == 4)
    assert err < REL_TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prefill_half_dtypes(dtype: torch.dtype) -> None:
    assert run_prefill(MIXED_BATCH, 4, 2, 64, 16, dtype) < REL_TOL[dtype]


def test_prefill_long_first_chunk() -> None:
    """A 300-token chunk with no prefix: many query tiles, causal masking inside every tile."""
    err = run_prefill([(300, 300), (15, 15)], 4, 1, 64, 16, torch.float32, pass_max_seqlen=True)
    assert err < REL_TOL[torch.float32]


@pytest.mark.parametrize("block_size", [8, 128])
def test_prefill_block_sizes(block_size: int) -> None:
    assert run_prefill([(70, 20), (129, 129)], 2, 1, 64, block_size, torch.float32) < REL_TOL[torch.float32]


def test_prefill_non_power_of_two_group_and_empty_chunk() -> None:
    """A sequence with no new tokens in the batch contributes no rows and no error."""
    assert run_prefill([(40, 8), (20, 0), (5, 5)], 3, 2, 64, 16, torch.float32) < REL_TOL[torch.float32]
