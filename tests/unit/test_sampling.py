"""The on-device sampler: greedy, top-k/top-p supports, seeded reproducibility, distribution."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvpilot.engine.worker.sampler import filter_top_k_top_p, sample  # noqa: E402

pytestmark = pytest.mark.unit


def _args(b: int, temperature: float, top_k: int = -1, top_p: float = 1.0):
    return (
        torch.full((b,), temperature),
        torch.full((b,), top_k, dtype=torch.long),
        torch.full((b,), top_p),
    )


def test_greedy_is_argmax() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    out = sample(logits, *_args(5, 0.0), [None] * 5)
    assert torch.equal(out, logits.argmax(-1))


def test_top_k_limits_support() -> None:
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(1)).repeat(400, 1)
    allowed = set(logits[0].topk(3).indices.tolist())
    out = sample(logits, *_args(400, 5.0, top_k=3), [None] * 400)
    assert set(out.tolist()) <= allowed and len(set(out.tolist())) == 3


def test_top_p_keeps_smallest_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = filter_top_k_top_p(probs.log(), torch.tensor([-1]), torch.tensor([0.8]))
    assert torch.isfinite(kept).tolist() == [[True, True, False, False]]
    kept = filter_top_k_top_p(probs.log(), torch.tensor([-1]), torch.tensor([0.81]))
    assert torch.isfinite(kept).tolist() == [[True, True, True, False]]
    kept = filter_top_k_top_p(probs.log(), torch.tensor([-1]), torch.tensor([0.01]))
    assert torch.isfinite(kept).tolist() == [[True, False, False, False]]


def test_seeded_rows_reproduce_and_unseeded_vary() -> None:
    logits = torch.zeros(1, 1000)

    def draw(seed: int | None) -> list[int]:
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        return [int(sample(logits, *_args(1, 1.0), [gen])) for _ in range(20)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_sampling_follows_the_distribution() -> None:
    target = torch.tensor([0.6, 0.3, 0.1])
    n = 6000
    logits = target.log().repeat(n, 1)
    out = sample(logits, *_args(n, 1.0), [None] * n)
    freq = torch.bincount(out, minlength=3).float() / n
    assert torch.allclose(freq, target, atol=0.03), freq


def test_mixed_greedy_and_sampled_rows() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 0.0, 0.0]])
    temps = torch.tensor([0.0, 1.0])
    out = sample(logits, temps, torch.tensor([-1, -1]), torch.tensor([1.0, 1.0]), [None, None])
    assert out[0] == 1
