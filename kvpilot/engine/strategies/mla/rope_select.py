"""Which rotate-half RoPE pairs each KV head keeps exact under the partial-RoPE MLA conversion.

MHA2MLA (Ji et al., 2025) keeps RoPE on a few pairs per head and drops it on the rest, which then go
through the latent unrotated. Two of its rules are offered:
- `high`: the rope_dims/2 highest-frequency pairs (i = 0, 1, ...: inv_freq falls with i), the same
  for every head; needs no data.
- `norm`: per KV head, the pairs whose query and key carry the most magnitude on calibration text,
  score_i = sum over the group's query heads of mean_t ||q_t,i|| x mean_t ||k_t,i|| (the 2-norm
  contribution rule: |q_i . k_i| <= ||q_i|| ||k_i||, and RoPE does not change a pair's norm, so
  pre-RoPE activations give the same scores).
`auto` is `norm` with calibration text, else `high`.
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


def resolve_rule(rule: str, calibrated: bool) -> str:
    """`auto` -> `norm` with calibration, `high` without; `norm` needs calibration."""
    if rule not in PAIR_RULES:
        raise ValueError(f"mla_rope_pairs {rule!r} is not a rule; choose one of {', '.join(PAIR_RULES)}")
    if rule == "auto":
        return "norm" if calibrated else "high"
    if rule == "norm" and not calibrated:
        raise ValueError("mla_rope_pairs='norm' scores pairs on calibration text: set conversion_calibration")
    return rule
