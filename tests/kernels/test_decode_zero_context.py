"""Decode rows with context length 0 (CUDA-graph padding, kvpilot/engine/worker/cuda_graphs.py): zeros, no NaN.

A padded row attends to nothing; its output is discarded, but a NaN there must not appear (split
reductions used to divide 0 by 0), and the real rows beside it must match the reference.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.kv_quant import reference as quant_ref
from kvpilot.engine.kernels.kv_quant.decode import paged_attention_decode_quant_triton
from kvpilot.engine.kernels.paged_decode.heuristics import DecodeConfig
from kvpilot.engine.kernels.paged_decode.launcher import paged_attention_decode_triton
from kvpilot.engine.kernels.paged_decode.reference import paged_attention_decode_reference
from tests.kernels.paged_cases import REL_TOL, make_paged_case, relative_error, strided_queries
from tests.kernels.test_kv_quant import make_quant_batch

pytestmark = pytest.mark.kernels

LENS = [0, 17, 0, 300]
REAL = [1, 3]
PADDED = [0, 2]


def check_rows(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    assert torch.isfinite(out).all(), "a context-length-0 row produced NaN/inf"
    assert out[PADDED].abs().max() == 0, "a context-length-0 row attended to something"
    assert relative_error(out[REAL], ref[REAL]) < tol


@pytest.mark.parametrize("splits", [1, 3])
def test_paged_decode_zero_context_rows(splits: int) -> None:
    case = make_paged_case(LENS, 2, 64, 16, torch.float32)
    q = strided_queries(len(LENS), 4, 2, 64, torch.float32)
    args = (q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, 0.125)
    out = paged_attention_decode_triton(*args, DecodeConfig(num_splits=splits))
    ref = paged_attention_decode_reference(*args)
    assert torch.isfinite(ref).all() and ref[PADDED].abs().max() == 0  # the torch path as well
    check_rows(out, ref, REL_TOL[torch.float32])


@pytest.mark.parametrize("splits", [1, 3])
def test_int8_decode_zero_context_rows(splits: int) -> None:
    k_cache, v_cache, k_scale, v_scale, tables, _, _ = make_quant_batch("int8", LENS, 2, 32)
    q = torch.randn(len(LENS), 4, 32, generator=torch.Generator().manual_seed(3))
    context = torch.tensor(LENS, dtype=torch.int32)
    args = (q, k_cache, v_cache, k_scale, v_scale, tables, context, 32**-0.5)
    out = paged_attention_decode_quant_triton(*args, num_splits=splits, block_n=32)
    ref = quant_ref.paged_attention_decode_quant_reference(*args, int8_qk=True)
    assert torch.isfinite(ref).all() and ref[PADDED].abs().max() == 0
    check_rows(out, ref, 1e-3)
