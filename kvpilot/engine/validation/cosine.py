"""Runtime validation: compare one layer's approximate attention with the exact one.

Every `validate_every` decode tokens on sampled sequences the engine computes both outputs; a
cosine below the threshold (0.92) moves the sequence to the exact path where one exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

COSINE_THRESHOLD = 0.92
VALIDATE_EVERY = 100


@dataclass(frozen=True)
class ValidationResult:
    """The measured cosine and whether (and why) the sequence falls back to the exact path."""

    cosine: float
    fallback: bool
    reason: str | None


def attention_cosine_tensor(exact: torch.Tensor, approx: torch.Tensor) -> torch.Tensor:
    """`attention_cosine` as a 0-d float64 tensor on the inputs' device (no host read)."""
    if exact.shape != approx.shape:
        raise ValueError(f"exact {tuple(exact.shape)} and approximate {tuple(approx.shape)} outputs differ in shape")
    e = exact.double().reshape(-1 if exact.dim() > 2 else 1, exact.shape[-2] * exact.shape[-1])
    a = approx.double().reshape(e.shape)
    dot = (e * a).sum(1)
    norms = e.norm(dim=1) * a.norm(dim=1)
    both_zero = (e.norm(dim=1) == 0) & (a.norm(dim=1) == 0)
    cos = torch.where(norms > 0, dot / norms.clamp_min(1e-300), torch.zeros_like(dot))
    cos = torch.where(both_zero, torch.ones_like(cos), cos)
    return cos.mean()


def attention_cosine(exact: torch.Tensor, approx: torch.Tensor) -> float:
    """Mean over tokens of the cosine between exact and approximate outputs [T, H, D] (or [H, D]).

    Each token's heads are concatenated; a zero vector against a zero vector counts as 1, against a
    non-zero one as 0.
    """
    return float(attention_cosine_tensor(exact, approx))


def measure_attention(exact: torch.Tensor, approx: torch.Tensor) -> torch.Tensor:
    """[2] float64 on the device: (1 if every approximate value is finite else 0, the cosine). What
    `verdict` decides from, computed without reading the device, so a check can be read a step later."""
    finite = torch.isfinite(approx).all().double()
    return torch.stack([finite, attention_cosine_tensor(exact, approx)])


def verdict(
    finite: bool, cosine: float, strategy: str, threshold: float = COSINE_THRESHOLD, has_exact_path: bool = True
) -> ValidationResult:
    """Decide fallback for one sequence from `measure_attention`'s two values."""
    if not finite:
        return ValidationResult(float("nan"), has_exact_path, f"{strategy}: non-finite approximate attention output")
    if cosine >= threshold:
        return ValidationResult(cosine, False, None)
    if not has_exact_path:
        return ValidationResult(
            cosine, False, f"{strategy}: attention cosine {cosine:.4f} < {threshold}, but no exact path to fall back to"
        )
    return ValidationResult(cosine, True, f"{strategy}: attention cosine {cosine:.4f} < {threshold}")


def should_validate(decode_tokens: int, every: int = VALIDATE_EVERY) -> bool:
    """True on every `every`-th decode token of a sequence (never on token 0)."""
    if every <= 0:
        raise ValueError(f"validate_every={every} must be positive")
    return decode_tokens > 0 and decode_tokens % every == 0


def validate_attention(
    exact: torch.Tensor,
    approx: torch.Tensor,
    strategy: str,
    threshold: float = COSINE_THRESHOLD,
    has_exact_path: bool = True,
) -> ValidationResult:
    """Decide fallback for one sequence from one layer's exact and approximate attention outputs."""
    finite, cosine = measure_attention(exact, approx).tolist()
    return verdict(finite > 0, cosine, strategy, threshold, has_exact_path)
