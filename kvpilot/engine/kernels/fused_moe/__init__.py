"""Mixture-of-experts MLP over stacked expert weights: Triton grouped GEMMs on CUDA, torch elsewhere.

`fused_moe(x, w13, w2, topk_weights, topk_ids)`: w13 [E, 2I, H] holds each expert's gate rows then
up rows, w2 [E, H, I] its down projection (models/moe.StackedExperts stacks the checkpoint's
per-expert tensors at load). The Triton path (launcher.py) sorts the token-expert assignments by
expert into padded blocks on the device (align.py) and runs gate/up with SiLU-and-mul, then down
with the routing weight, then sums over top-k: a fixed number of launches and no host sync, so CUDA
graphs capture it. `KVPILOT_KERNELS=torch` forces the reference (reference.py), which syncs.
"""

from __future__ import annotations

import torch

from kvpilot.engine.kernels.dispatch import backend_for
from kvpilot.engine.kernels.fused_moe.reference import fused_moe_reference

__all__ = ["fused_moe"]


def fused_moe(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """sum over k of topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) for x [T, H] -> [T, H]."""
    if backend_for(x) == "triton" and x.dim() == 2:
        from kvpilot.engine.kernels.fused_moe.launcher import fused_moe_triton

        return fused_moe_triton(x if x.stride(1) == 1 else x.contiguous(), w13, w2, topk_weights, topk_ids)
    return fused_moe_reference(x, w13, w2, topk_weights, topk_ids)
