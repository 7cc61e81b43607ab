"""Pure-torch mixture-of-experts MLP over stacked expert weights: the math of HF's per-expert loop.

Each routed (token, slot) pair runs its expert, down(silu(gate x) * up x), scaled by its routing
weight; the outputs are summed per token in ascending expert order, as HF's DeepSeek-V2 and
MiniMax blocks accumulate. The CPU engine runs this (it syncs with the host, `unique().tolist()`);
the Triton kernels (launcher.py) are checked against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fused_moe_reference(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows then up rows), w2 [E, H, I]; topk_weights [T, k] (fp32),
    topk_ids [T, k] -> [T, H] in x's dtype."""
    inter = w2.shape[2]
    out = torch.zeros_like(x)
    for expert in topk_ids.unique().tolist():  # ascending, as HF accumulates
        token, slot = torch.where(topk_ids == expert)
        gate, up = F.linear(x[token], w13[expert]).split(inter, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[expert]) * topk_weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out
