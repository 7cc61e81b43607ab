"""Runtime validation: cosine between exact and approximate attention, threshold 0.92, fallback."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.validation.cosine import (
    COSINE_THRESHOLD,
    attention_cosine,
    should_validate,
    validate_attention,
)

pytestmark = pytest.mark.unit


def test_identical_outputs_do_not_fall_back() -> None:
    x = torch.randn(3, 4, 8)
    result = validate_attention(x, x.clone(), "mla")
    assert result.cosine == pytest.approx(1.0) and not result.fallback and result.reason is None


def test_threshold_is_092_and_inclusive() -> None:
    assert COSINE_THRESHOLD == 0.92
    exact = torch.tensor([[1.0, 0.0]])
    for cos, falls in ((0.95, False), (0.92, False), (0.919, True), (-1.0, True)):
        sin = (1 - cos**2) ** 0.5
        approx = torch.tensor([[cos, sin]], dtype=torch.float64)
        result = validate_attention(exact.double(), approx, "performer")
        assert result.fallback is falls, (cos, result)
        assert result.cosine == pytest.approx(cos, abs=1e-9)
        if falls:
            assert "performer" in result.reason and "0.92" in result.reason


def test_non_finite_output_falls_back_with_reason() -> None:
    approx = torch.ones(2, 2, 4)
    approx[0, 0, 0] = float("nan")
    result = validate_attention(torch.ones(2, 2, 4), approx, "int8")
    assert result.fallback and "non-finite" in result.reason


def test_without_exact_path_keeps_the_sequence_but_says_why() -> None:
    result = validate_attention(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), "linear", has_exact_path=False)
    assert not result.fallback and "no exact path" in result.reason


def test_cosine_is_mean_over_tokens_and_handles_zeros() -> None:
    exact = torch.tensor([[[1.0, 0.0]], [[1.0, 0.0]]])
    approx = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
    assert attention_cosine(exact, approx) == pytest.approx(0.5)
    assert attention_cosine(torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)) == 1.0
    assert attention_cosine(torch.zeros(1, 2, 2), torch.ones(1, 2, 2)) == 0.0
    with pytest.raises(ValueError, match="shape"):
        attention_cosine(torch.zeros(2, 2), torch.zeros(2, 3))


def test_validate_every_hundred_tokens() -> None:
    assert [t for t in range(0, 301) if should_validate(t)] == [100, 200, 300]
    with pytest.raises(ValueError):
        should_validate(5, every=0)
