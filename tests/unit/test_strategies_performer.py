"""Performer-style attention: exact window + random-feature summary of older tokens."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.strategies.linear.features import (
    PerformerSummary,
    draw_features,
    exact_causal_attention,
    performer_attention,
    performer_decode_step,
    update_summary,
)

pytestmark = pytest.mark.unit


def qkv(t: int = 24, heads: int = 2, dim: int = 16, seed: int = 0, std: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(t, heads, dim, generator=gen) * std for _ in range(3))


def test_window_covering_the_sequence_is_exact_softmax() -> None:
    q, k, v = qkv()
    w = draw_features(32, 16, torch.Generator().manual_seed(1))
    got = performer_attention(q, k, v, w, window=24, scale=0.25)
    assert torch.allclose(got, exact_causal_attention(q, k, v, 0.25), atol=1e-6)


def test_decode_step_with_summary_equals_full_form() -> None:
    q, k, v = qkv(t=30)
    w = draw_features(64, 16, torch.Generator().manual_seed(2))
    window, scale = 8, 0.25
    full = performer_attention(q, k, v, w, window, scale)
    t = 29  # last token: keys 22..29 exact, 0..21 in the summary
    summary = update_summary(PerformerSummary.empty(2, 64, 16), k[: t - window + 1], v[: t - window + 1], w, scale)
    assert summary.num_tokens == 22
    step = performer_decode_step(q[t], k[t - window + 1 : t + 1], v[t - window + 1 : t + 1], summary, w, scale)
    assert torch.allclose(step, full[t], atol=1e-5)


def test_summary_updates_accumulate() -> None:
    _, k, v = qkv(t=10)
    w = draw_features(16, 16)
    once = update_summary(PerformerSummary.empty(2, 16, 16), k, v, w, 0.25)
    first = update_summary(PerformerSummary.empty(2, 16, 16), k[:4], v[:4], w, 0.25)
    twice = update_summary(first, k[4:], v[4:], w, 0.25)
    assert torch.allclose(once.kv, twice.kv, atol=1e-5) and torch.allclose(once.z, twice.z, atol=1e-5)
    assert twice.num_tokens == 10 and first.num_tokens == 4


def test_many_features_approximate_softmax_beyond_the_window() -> None:
    q, k, v = qkv(t=64, std=0.5)
    w = draw_features(1024, 16, torch.Generator().manual_seed(3))
    approx = performer_attention(q, k, v, w, window=4, scale=0.25)
    exact = exact_causal_attention(q, k, v, 0.25)
    cos = torch.nn.functional.cosine_similarity(approx.reshape(64, -1), exact.reshape(64, -1), dim=-1)
    assert cos.min() > 0.95
    few = performer_attention(q, k, v, draw_features(4, 16, torch.Generator().manual_seed(3)), 4, 0.25)
    assert (few - exact).norm() > (approx - exact).norm(), "more features must approximate better"


def test_orthogonal_features_within_a_block() -> None:
    w = draw_features(16, 16, torch.Generator().manual_seed(4))
    directions = w / w.norm(dim=1, keepdim=True)
    assert torch.allclose(directions @ directions.T, torch.eye(16), atol=1e-5)
    assert draw_features(40, 16).shape == (40, 16)


def test_rejects_empty_window() -> None:
    q, k, v = qkv(t=4)
    with pytest.raises(ValueError, match="window"):
        performer_attention(q, k, v, draw_features(8, 16), window=0, scale=0.25)
