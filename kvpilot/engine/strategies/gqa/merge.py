"""Weighted merges of a group's K/V projection rows (closed form, no I/O): keys by the queries' energy
per dim, values through o_proj. Used by calibrated grouping (calibrate.py) and as the starting point
that compensation (compensate.py) improves on."""

from __future__ import annotations

import torch


def merge_keys(source: torch.Tensor, weights: torch.Tensor, groups: int) -> torch.Tensor:
    """K weight [H*D, ...] (heads in group order) -> [groups*D, ...]: per dim, the mean of the group's
    heads weighted by `weights` [H, D] (the queries' energy): the merged key that keeps q.k closest."""
    heads, d = weights.shape
    rows = source.double().reshape(groups, heads // groups, d, -1)
    w = weights.double().reshape(groups, heads // groups, d, 1).clamp_min(1e-12)
    return ((rows * w).sum(1) / w.sum(1)).reshape(groups * d, *source.shape[1:])


def merge_values(source: torch.Tensor, grams: torch.Tensor, groups: int, damping: float = 1e-6) -> torch.Tensor:
    """V weight [H*D, ...] (heads in group order) -> [groups*D, ...]: per group, (sum G_h)^-1 sum G_h V_h,
    the merged value whose error through o_proj is least (`output_grams`)."""
    heads, d, _ = grams.shape
    rows = source.double().reshape(groups, heads // groups, d, -1)
    g = grams.double().reshape(groups, heads // groups, d, d)
    total = g.sum(1)
    eye = torch.eye(d, dtype=total.dtype, device=total.device)
    total = total + damping * total.diagonal(dim1=1, dim2=2).mean(-1)[:, None, None] * eye
    merged = torch.linalg.solve(total, torch.einsum("ghde,ghen->gdn", g, rows))
    return merged.reshape(groups * d, *source.shape[1:])
