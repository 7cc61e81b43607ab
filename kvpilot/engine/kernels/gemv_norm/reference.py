"""Pure torch: the composition the fused kernel replaces (and the CPU path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvpilot.engine.kernels.rmsnorm.reference import rmsnorm_reference
from kvpilot.engine.kernels.silu_mul.reference import silu_mul_reference


def linear_add_rmsnorm_reference(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
    silu_input: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(norm_weight * rmsnorm(y + residual), y + residual) with y = x @ weight.T, or with
    y = silu(gate) * up @ weight.T where x = [gate | up] (silu_input)."""
    if silu_input:
        gate, up = x.chunk(2, dim=-1)
        x = silu_mul_reference(gate, up)
    return rmsnorm_reference(F.linear(x, weight), norm_weight, eps, residual)
