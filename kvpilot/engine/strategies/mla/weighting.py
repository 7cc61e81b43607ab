"""Output-side weights for the MLA conversion: what the layer's other side makes of a K/V error.

The calibrated factorisation (svd.py) weights the input side by the activations' covariance; these
weight the output side, so the shared latent keeps what the layer's attention actually uses:
- Keys: a key error e changes the score of query q at relative position delta by (R_delta q) . e.
  Averaged over RoPE angles, E[R q q^T R^T] keeps, per rotate-half pair (i, i + D/2), only the pair's
  mean energy (|q_i|^2 + |q_i+D/2|^2) / 2 on both dims: a diagonal, pair-constant weight, the one
  symmetric weight that commutes with every rotation (a 2x2 per-pair form that commutes is a scaled
  rotation, whose Gram is again a multiple of I). Summed over a KV head's query heads.
- Values: an error e in head h's values reaches the output as O_h e; its squared norm is e^T G_h e
  with G_h = sum over h's query heads of O_j^T O_j (the o_proj Gram, block-diagonal over KV heads).
Both are returned as left factors L (L^T L = the weight, damped so that L is invertible).
"""

from __future__ import annotations

import torch


def key_pair_energy(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """q [T, Hq, D] (before or after RoPE: a pair's norm is the same) -> [Hkv, D]: per KV head, the sum
    over its query heads of the mean squared query, averaged over each rotate-half pair."""
    _, heads, d = q.shape
    if heads % kv_heads or d % 2:
        raise ValueError(f"{heads} query heads of dim {d}: expected a multiple of Hkv={kv_heads} and an even dim")
    w = q.double().pow(2).mean(0).view(kv_heads, heads // kv_heads, d).sum(1)
    pair = (w[:, : d // 2] + w[:, d // 2 :]) / 2
    return torch.cat([pair, pair], dim=1)


def value_grams(o_weight: torch.Tensor, kv_heads: int, head_dim: int) -> torch.Tensor:
    """o_proj weight [hidden, Hq*Dv] -> [Hkv, Dv, Dv]: sum over each KV head's query heads of O_j^T O_j."""
    hidden, width = o_weight.shape
    if width % (kv_heads * head_dim):
        raise ValueError(f"o_proj width {width} is not a multiple of Hkv={kv_heads} x head_dim={head_dim}")
    blocks = o_weight.double().view(hidden, kv_heads, -1, head_dim)  # [hidden, Hkv, s, Dv]
    return torch.einsum("nhsd,nhse->hde", blocks, blocks)


def key_factor(energy: torch.Tensor, damping: float = 1e-3) -> torch.Tensor:
    """[Hkv, D] energies -> [Hkv, D] diagonal factor sqrt(w + damping * mean w) (per head)."""
    w = energy.double().clamp_min(0)
    return (w + damping * w.mean(-1, keepdim=True).clamp_min(1e-30)).sqrt()


def value_factor(grams: torch.Tensor, damping: float = 1e-3) -> torch.Tensor:
    """[Hkv, Dv, Dv] Grams -> [Hkv, Dv, Dv] upper-triangular L with L^T L = G + damping * mean diag(G) I."""
    g = grams.double()
    eye = torch.eye(g.shape[-1], dtype=g.dtype, device=g.device)
    scale = g.diagonal(dim1=1, dim2=2).mean(-1).clamp_min(1e-30)[:, None, None]
    return torch.linalg.cholesky(g + damping * scale * eye).mT
