"""Which rotate-half RoPE pairs each KV head keeps exact under the partial-RoPE MLA conversion.

MHA2MLA (Ji et al., 2025) keeps RoPE on a few pairs per head and drops it on the rest, which then go
through the latent unrotated. Two of its rules are offered:
- `high`: the rope_dims/2 highest-frequency pairs (i = 0, 1, ...: inv_freq falls with i), the same
  for every head; needs no data.
- `norm`: per KV head, the pairs whose query and key carry the most magnitude on calibration text,
  score_i = sum over the group's query heads of mean_t ||q_t,i|| x mean_t ||k_t,i|| (the 2-norm
  contribution rule: |q_i . k_i| <= ||q_i|| ||k_i||, and RoPE does not change a pair's norm, so
  pre-RoPE activations give the same scores).
- `turn`: `norm` weighted by how far RoPE turns the pair over the served context L: dropping RoPE on
  pair i changes its score term by Re[q k* (e^(i theta_i delta) - 1)], whose mean square over distances
  delta uniform in [0, L) is about |q|^2 |k|^2 (1 - sin(theta_i L) / (theta_i L)); so
  score_i = norm score_i x sqrt(1 - sinc(theta_i L)). A loud pair that barely rotates within L (the
  lowest frequencies) loses little without RoPE; `norm` alone keeps it anyway.
`auto` is the measured best with calibration text (`turn`, docs/benchmarks.md "MLA conversion:
absorbed decode"), else `high`.
"""

from __future__ import annotations

import torch

from kvpilot.engine.config.strategy import MLA_ROPE_PAIRS as PAIR_RULES


def high_frequency_pairs(num_kv_heads: int, rope_dims: int) -> torch.Tensor:
    """[Hkv, rope_dims/2]: pairs 0..rope_dims/2-1 for every head."""
    return torch.arange(rope_dims // 2).expand(num_kv_heads, -1).clone()


def pair_norms(x: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] -> mean over tokens of each rotate-half pair's norm, [heads, D/2]."""
    t, heads, dim = x.shape
    return x.double().view(t, heads, 2, dim // 2).norm(dim=2).mean(dim=0)


def norm_pairs(q: torch.Tensor, k: torch.Tensor, rope_dims: int) -> torch.Tensor:
    """q [T, H, D], k [T, Hkv, D] (calibration activations, before or after RoPE) -> [Hkv, rope_dims/2]
    pairs of largest 2-norm contribution per KV head, ascending."""
    heads, num_kv_heads = q.shape[1], k.shape[1]
    scores = pair_norms(q).view(num_kv_heads, heads // num_kv_heads, -1).sum(dim=1) * pair_norms(k)
    return scores.topk(rope_dims // 2, dim=1).indices.sort(dim=1).values


def turn_weights(inv_freq: torch.Tensor, length: int) -> torch.Tensor:
    """[D/2]: sqrt(1 - sin(theta L) / (theta L)), the RMS of |e^(i theta delta) - 1| / sqrt(2) over delta in [0, L)."""
    angle = inv_freq.double() * length
    sinc = torch.where(angle > 0, torch.sin(angle) / angle.clamp_min(1e-30), torch.ones_like(angle))
    return (1 - sinc).clamp_min(0).sqrt()


def turn_pairs(q: torch.Tensor, k: torch.Tensor, rope_dims: int, inv_freq: torch.Tensor, length: int) -> torch.Tensor:
    """`norm_pairs`' scores times `turn_weights` -> [Hkv, rope_dims/2] pairs, ascending."""
    heads, num_kv_heads = q.shape[1], k.shape[1]
    scores = pair_norms(q).view(num_kv_heads, heads // num_kv_heads, -1).sum(dim=1) * pair_norms(k)
    scores = scores * turn_weights(inv_freq.to(scores.device), length)[None]
    return scores.topk(rope_dims // 2, dim=1).indices.sort(dim=1).values


def resolve_rule(rule: str, calibrated: bool) -> str:
    """`auto` -> `turn` with calibration, `high` without; `norm` and `turn` need calibration."""
    if rule not in PAIR_RULES:
        raise ValueError(f"mla_rope_pairs {rule!r} is not a rule; choose one of {', '.join(PAIR_RULES)}")
    if rule == "auto":
        return "turn" if calibrated else "high"
    if rule in ("norm", "turn") and not calibrated:
        raise ValueError(f"mla_rope_pairs={rule!r} scores pairs on calibration text: set conversion_calibration")
    return rule
