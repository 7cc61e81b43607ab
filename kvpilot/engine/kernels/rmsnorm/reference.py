"""Pure-torch RMSNorm (fp32 statistics, as HF) with an optional residual added first."""

from __future__ import annotations

import torch


def rmsnorm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * norm(s), s) where s = x + residual (rounded to x's dtype), or s = x without a residual."""
    s = x if residual is None else x + residual
    h = s.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(s.dtype), s
