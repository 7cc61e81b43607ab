"""Pure-torch RoPE of DeepSeek's rope dims (HF's math): fp32 angles, cos/sin scaled by the YaRN factor."""

from __future__ import annotations

import torch


def mla_rope_reference(
    positions: torch.Tensor, inv_freq: torch.Tensor, x: torch.Tensor, attention_factor: float, interleave: bool
) -> torch.Tensor:
    """x [T, heads, R] at positions [T]: interleaved pairs (2i, 2i+1) or rotate-half pairs (i, i + R/2)."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    cos = (freqs.cos() * attention_factor)[:, None, :]
    sin = (freqs.sin() * attention_factor)[:, None, :]
    h = x.float()
    if interleave:
        x1, x2 = h[..., 0::2], h[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        half = x.shape[-1] // 2
        x1, x2 = h[..., :half], h[..., half:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)
