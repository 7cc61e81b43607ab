"""DeepSeek's RoPE on the rope dims of q and the shared k_pe: one Triton launch per tensor on CUDA (the
torch form is ~15 elementwise kernels per call, twice per layer), the torch reference elsewhere."""

from __future__ import annotations

import torch

from kvpilot.engine.kernels.dispatch import backend_for
from kvpilot.engine.kernels.mla_rope.reference import mla_rope_reference

__all__ = ["mla_rope"]


def mla_rope(
    positions: torch.Tensor, inv_freq: torch.Tensor, x: torch.Tensor, attention_factor: float, interleave: bool
) -> torch.Tensor:
    """x [T, heads, R] rotated at positions [T]: interleaved pairs (V2) or rotate-half pairs."""
    if backend_for(x) == "triton" and x.dim() == 3 and x.stride(-1) == 1 and inv_freq.dtype == torch.float32:
        from kvpilot.engine.kernels.mla_rope.launcher import mla_rope_triton

        return mla_rope_triton(positions, inv_freq, x, attention_factor, interleave)
    return mla_rope_reference(positions, inv_freq, x, attention_factor, interleave)
