"""MLA conversion: shared K/V latent by truncated SVD, RoPE dims kept exact."""

from __future__ import annotations

import itertools

import pytest
import torch

from kvpilot.engine.strategies.mla.svd import (
    factorize_kv,
    reconstruct_k,
    reconstruct_v,
    rope_keep_index,
)

pytestmark = pytest.mark.unit


def weights(heads: int = 4, dim: int = 16, hidden: int = 48, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(heads * dim, hidden, generator=gen), torch.randn(heads * dim, hidden, generator=gen)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("rope_dims", [0, 4])
def test_full_rank_reconstructs_exactly(rope_dims: int) -> None:
    w_k, w_v = weights()
    conv = factorize_kv(w_k, w_v, num_kv_heads=4, rank=48, rope_dims=rope_dims)
    assert conv.error < 1e-6 and conv.error_k < 1e-6 and conv.error_v < 1e-6
    assert rel(reconstruct_k(conv, 4), w_k) < 1e-5 and rel(reconstruct_v(conv), w_v) < 1e-5


def test_error_falls_monotonically_with_rank() -> None:
    w_k, w_v = weights()
    errors = [factorize_kv(w_k, w_v, 4, rank, rope_dims=4).error for rank in (4, 8, 16, 24, 32, 40, 48)]
    assert all(a > b for a, b in itertools.pairwise(errors)), errors
    assert errors[0] > 0.5 and errors[-1] < 1e-6


def test_reported_error_matches_reconstruction() -> None:
    w_k, w_v = weights(seed=1)
    conv = factorize_kv(w_k, w_v, 4, rank=12, rope_dims=0)
    assert rel(reconstruct_v(conv), w_v) == pytest.approx(conv.error_v, rel=1e-4)
    assert rel(reconstruct_k(conv, 4), w_k) == pytest.approx(conv.error_k, rel=1e-4)
    assert "latent_rank=12" in conv.report()


def test_rope_dims_stay_exact_and_latent_reproduces_kv() -> None:
    w_k, w_v = weights(seed=2)
    conv = factorize_kv(w_k, w_v, 4, rank=20, rope_dims=6)
    keep = rope_keep_index(16, 6)
    assert keep.tolist() == [0, 1, 2, 8, 9, 10]
    k_hat = reconstruct_k(conv, 4).view(4, 16, -1)
    assert torch.allclose(k_hat[:, keep], w_k.view(4, 16, -1)[:, keep])
    x = torch.randn(5, 48)
    latent = x @ conv.down.T  # what the cache holds, [5, 20]
    assert latent.shape == (5, 20)
    assert torch.allclose(latent @ conv.up_v.T, x @ reconstruct_v(conv).T, atol=1e-4)


def test_low_rank_weights_factorise_exactly_at_their_rank() -> None:
    gen = torch.Generator().manual_seed(3)
    shared = torch.randn(6, 32, generator=gen)
    w_k = torch.randn(2 * 8, 6, generator=gen) @ shared
    w_v = torch.randn(2 * 8, 6, generator=gen) @ shared
    assert factorize_kv(w_k, w_v, 2, rank=6).error < 1e-6


@pytest.mark.parametrize(("rank", "rope_dims"), [(0, 0), (49, 0), (8, 3), (8, 18)])
def test_rejects_bad_rank_or_rope_dims(rank: int, rope_dims: int) -> None:
    w_k, w_v = weights()
    with pytest.raises(ValueError):
        factorize_kv(w_k, w_v, 4, rank=rank, rope_dims=rope_dims)
