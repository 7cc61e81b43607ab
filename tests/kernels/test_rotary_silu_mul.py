"""RoPE and silu(gate) * up: the Triton kernels against their torch references (packed tokens, odd sizes)."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.rotary.launcher import rotary_triton
from kvpilot.engine.kernels.rotary.reference import rotary_reference
from kvpilot.engine.kernels.silu_mul.launcher import silu_mul_triton
from kvpilot.engine.kernels.silu_mul.reference import silu_mul_reference
from kvpilot.engine.models.layers import rope_inv_freq
from tests.kernels.paged_cases import DEVICE

pytestmark = pytest.mark.kernels
# TRITON_INTERPRET=1 truncates fp32 -> bf16 casts (CUDA rounds): bf16 results agree within a few ulps there
BF16_TOL = {"rtol": 2**-6, "atol": 2e-2}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "head_dim"), [(1, 4, 1, 64), (15, 8, 2, 128), (63, 3, 3, 32), (5, 20, 4, 64)])
def test_rotary_matches_reference(dtype: torch.dtype, tokens: int, heads: int, kv_heads: int, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(tokens + heads)
    positions = torch.randint(0, 8192, (tokens,), generator=gen).to(DEVICE)
    inv_freq = rope_inv_freq(head_dim, 500000.0, None).to(DEVICE)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype).to(DEVICE)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)  # views of one projection output (strided rows)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    want_q, want_k = rotary_reference(positions, inv_freq, q, k)
    got_q, got_k = rotary_triton(positions, inv_freq, q, k)
    for got, want in ((got_q, want_q), (got_k, want_k)):
        assert rel_err(got, want) < (1e-5 if dtype == torch.float32 else 1.6e-2)
        torch.testing.assert_close(got, want, **({"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else BF16_TOL))


@pytest.mark.parametrize(("tokens", "rows"), [(2, 4), (9, 4)])
def test_rotary_query_tap_holds_the_first_rotated_q_rows(tokens: int, rows: int) -> None:
    gen = torch.Generator().manual_seed(tokens)
    positions = torch.randint(0, 4096, (tokens,), generator=gen).to(DEVICE)
    inv_freq = rope_inv_freq(64, 10000.0, None).to(DEVICE)
    q = torch.randn(tokens, 12, 64, generator=gen).to(DEVICE)  # two programs' worth of query heads per token
    k = torch.randn(tokens, 2, 64, generator=gen).to(DEVICE)
    tap = torch.full((rows, 12, 64), 7.0, device=DEVICE)
    got_q, got_k = rotary_triton(positions, inv_freq, q, k, query_tap=tap)
    want_q, want_k = rotary_triton(positions, inv_freq, q, k)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=0)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=0)
    kept = min(tokens, rows)
    torch.testing.assert_close(tap[:kept], got_q[:kept], rtol=0, atol=0)
    assert (tap[kept:] == 7.0).all()  # rows past the step's tokens are left as they were


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "kv_heads", "head_dim"), [(1, 1, 64), (13, 3, 32)])
def test_rotary_store_writes_the_rotated_k_and_v_as_store_kvcache_does(dtype, tokens, kv_heads, head_dim) -> None:
    from kvpilot.engine.kernels.store_kvcache.reference import store_kvcache_reference

    gen = torch.Generator().manual_seed(tokens * 7 + kv_heads)
    heads, blocks, page = 2 * kv_heads, 6, 4
    positions = torch.randint(0, 4096, (tokens,), generator=gen).to(DEVICE)
    inv_freq = rope_inv_freq(head_dim, 10000.0, None).to(DEVICE)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype).to(DEVICE)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].view(tokens, kv_heads, head_dim)  # strided rows, as in the model
    slots = torch.randperm(blocks * page, generator=gen)[:tokens].to(torch.int32)
    slots[tokens // 2] = -1  # a padded row: written nowhere
    slots = slots.to(DEVICE)
    caches = [torch.full((blocks, page, kv_heads, head_dim), 5.0, dtype=dtype, device=DEVICE) for _ in range(4)]
    got_q, got_k = rotary_triton(positions, inv_freq, q, k, store=(v, caches[0], caches[1], slots))
    want_q, want_k = rotary_triton(positions, inv_freq, q, k)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=0)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=0)
    store_kvcache_reference(want_k, v, caches[2], caches[3], slots)
    torch.testing.assert_close(caches[0], caches[2], rtol=0, atol=0)
    torch.testing.assert_close(caches[1], caches[3], rtol=0, atol=0)
    assert (caches[0] == 5.0).sum() == (blocks * page - (tokens - 1)) * kv_heads * head_dim


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "width"), [(1, 1), (15, 300), (4, 2500)])
def test_silu_mul_matches_reference(dtype: torch.dtype, tokens: int, width: int) -> None:
    gen = torch.Generator().manual_seed(width)
    gate = (4 * torch.randn(tokens, width, generator=gen)).to(dtype).to(DEVICE)
    up = torch.randn(tokens, width, generator=gen).to(dtype).to(DEVICE)
    want, got = silu_mul_reference(gate, up), silu_mul_triton(gate, up)
    assert rel_err(got, want) < (1e-6 if dtype == torch.float32 else 1.6e-2)
    torch.testing.assert_close(got, want, **({"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else BF16_TOL))
