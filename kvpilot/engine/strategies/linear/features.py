"""Performer-style linear attention for softmax checkpoints: exact recent window + summary of older tokens.

Positive random features (FAVOR+, Choromanski et al., 2021): with x' = x * scale**0.5,
phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m) gives E[phi(q) . phi(k)] = exp(scale * q.k), so older keys
enter a fixed-size summary S = sum phi(k) v^T [H, m, Dv], z = sum phi(k) [H, m], while the most
recent `window` tokens keep exact softmax weights. Both estimate the same unnormalised weights, so a
query combines them in one normalisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def draw_features(num_features: int, head_dim: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Orthogonal Gaussian features W [m, d]: orthonormal blocks rescaled by chi-distributed norms."""
    blocks = []
    for _ in range(-(-num_features // head_dim)):
        g = torch.randn(head_dim, head_dim, generator=generator, dtype=torch.float64)
        q, _ = torch.linalg.qr(g)
        blocks.append(q.T)
    w = torch.cat(blocks)[:num_features]
    norms = torch.randn(num_features, head_dim, generator=generator, dtype=torch.float64).norm(dim=1)
    return (w * norms[:, None]).float()


def log_features(x: torch.Tensor, w: torch.Tensor, scale: float) -> torch.Tensor:
    """log phi(x) [..., m] for x [..., d] (kept in log space for stability)."""
    xs = x.float() * math.sqrt(scale)
    return xs @ w.T - 0.5 * (xs * xs).sum(-1, keepdim=True) - 0.5 * math.log(w.shape[0])


@dataclass
class PerformerSummary:
    """The fixed-size summary of one sequence's tokens older than the window."""

    kv: torch.Tensor  # [H, m, Dv] sum phi(k) v^T
    z: torch.Tensor  # [H, m] sum phi(k)
    num_tokens: int = 0

    @classmethod
    def empty(cls, num_heads: int, num_features: int, v_dim: int) -> PerformerSummary:
        return cls(torch.zeros(num_heads, num_features, v_dim), torch.zeros(num_heads, num_features))


def update_summary(
    summary: PerformerSummary, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, scale: float
) -> PerformerSummary:
    """Fold tokens leaving the window, k [N, H, d] and v [N, H, Dv], into the summary (returns a new one)."""
    phi = log_features(k, w, scale).exp()  # [N, H, m]
    return PerformerSummary(
        kv=summary.kv + torch.einsum("nhm,nhv->hmv", phi, v.float()),
        z=summary.z + phi.sum(0),
        num_tokens=summary.num_tokens + k.shape[0],
    )


def performer_decode_step(
    q: torch.Tensor,
    window_k: torch.Tensor,
    window_v: torch.Tensor,
    summary: PerformerSummary,
    w: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query q [H, d] over the exact window (k, v [W, H, *], the query's own token included) and the
    summary of everything older -> [H, Dv] fp32."""
    logits = torch.einsum("hd,whd->hw", q.float(), window_k.float()) * scale
    log_phi_q = log_features(q, w, scale)  # [H, m]
    shift = torch.maximum(logits.max(dim=1).values, log_phi_q.max(dim=1).values)
    p = (logits - shift[:, None]).exp()
    phi_q = (log_phi_q - shift[:, None]).exp()
    num = torch.einsum("hw,whv->hv", p, window_v.float()) + torch.einsum("hm,hmv->hv", phi_q, summary.kv)
    den = p.sum(1) + (phi_q * summary.z).sum(1)
    return num / den[:, None]


def performer_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, window: int, scale: float
) -> torch.Tensor:
    """Causal attention of one sequence, q, k [T, H, d], v [T, H, Dv] -> [T, H, Dv] fp32.

    Query t weighs keys in (t - window, t] exactly and older keys by phi(q).phi(k); the combined
    log-weights go through one softmax (the approximate ones as log of the feature dot product).
    """
    if window < 1:
        raise ValueError(f"window={window} must be at least 1 (the query's own token)")
    num_tokens = q.shape[0]
    exact = torch.einsum("thd,shd->hts", q.float(), k.float()) * scale
    lq = log_features(q, w, scale).transpose(0, 1)  # [H, T, m]
    lk = log_features(k, w, scale).transpose(0, 1)
    approx = torch.logsumexp(lq[:, :, None, :] + lk[:, None, :, :], dim=-1)  # [H, T, T]
    pos = torch.arange(num_tokens)
    age = pos[:, None] - pos[None, :]
    logits = torch.where(age < window, exact, approx)
    logits = logits.masked_fill(age < 0, float("-inf"))
    return torch.einsum("hts,shv->thv", logits.softmax(dim=-1), v.float())


def exact_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Plain causal softmax attention of one sequence [T, H, *] -> [T, H, Dv] fp32."""
    logits = torch.einsum("thd,shd->hts", q.float(), k.float()) * scale
    pos = torch.arange(q.shape[0])
    logits = logits.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
    return torch.einsum("hts,shv->thv", logits.softmax(dim=-1), v.float())
