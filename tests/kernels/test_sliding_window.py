"""Sliding-window attention in the paged kernels: each query sees its last `window` positions.

The torch reference is checked against an independent mask built from HF Mistral's definition
(key j visible from query p when p - window < j <= p); the Triton kernels against the reference,
with windows shorter than a block, crossing block and tile edges, and longer than every context.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.paged_checks import kernel_window
from kvpilot.engine.kernels.paged_decode.heuristics import DecodeConfig
from kvpilot.engine.kernels.paged_decode.launcher import paged_attention_decode_triton
from kvpilot.engine.kernels.paged_decode.reference import paged_attention_decode_reference
from kvpilot.engine.kernels.paged_prefill.launcher import paged_attention_prefill_triton
from kvpilot.engine.kernels.paged_prefill.reference import attend, paged_attention_prefill_reference
from tests.kernels.paged_cases import REL_TOL, cu_seqlens, make_paged_case, relative_error, strided_queries

pytestmark = pytest.mark.kernels

BATCH = [(17, 17), (63, 15), (300, 1), (1, 1), (40, 16)]  # (context, chunk): prefixes, single tokens, a long one
WINDOWS = [5, 16, 37, 4096]


def test_the_reference_window_is_hf_mistrals_band() -> None:
    torch.manual_seed(0)
    length, window = 12, 4
    q, k, v = torch.randn(length, 2, 8), torch.randn(length, 1, 8), torch.randn(length, 1, 8)
    got = attend(q, k, v, 0.5, window)
    p, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    visible = (j <= p) & (j > p - window)
    scores = torch.einsum("qhd,khd->hqk", q, k.expand(-1, 2, -1)) * 0.5
    want = torch.einsum("hqk,khd->qhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v.expand(-1, 2, -1))
    assert torch.allclose(got, want, atol=1e-6)
    assert not torch.allclose(got, attend(q, k, v, 0.5), atol=1e-3)  # the window changes the answer


@pytest.mark.parametrize("window", WINDOWS)
def test_prefill_window_matches_the_reference(window: int) -> None:
    context_lens, q_lens = [c for c, _ in BATCH], [n for _, n in BATCH]
    case = make_paged_case(context_lens, 2, 64, 16, torch.float32)
    q = strided_queries(sum(q_lens), 8, 2, 64, torch.float32)
    args = (q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens(q_lens, device=str(q.device)),
            case.context_lens, 0.125)
    out = paged_attention_prefill_triton(*args, max(q_lens), window)
    ref = paged_attention_prefill_reference(*args, window)
    assert relative_error(out, ref) < REL_TOL[torch.float32]
    if window < 300:
        assert relative_error(ref, paged_attention_prefill_reference(*args)) > 1e-3  # the case exercises the window


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", WINDOWS)
def test_decode_window_matches_the_reference(window: int, num_splits: int) -> None:
    context_lens = [0, 1, 15, 16, 17, 63, 300]
    case = make_paged_case(context_lens, 2, 64, 16, torch.float32)
    q = strided_queries(len(context_lens), 8, 2, 64, torch.float32)
    args = (q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, 0.125)
    out = paged_attention_decode_triton(*args, DecodeConfig(num_splits=num_splits, block_n=32), window=window)
    ref = paged_attention_decode_reference(*args, window)
    assert relative_error(out, ref) < REL_TOL[torch.float32]


def test_a_negative_window_is_refused_by_name() -> None:
    assert kernel_window(0) > 10**8 and kernel_window(4096) == 4096
    with pytest.raises(ValueError, match="sliding window must be 0"):
        kernel_window(-1)
