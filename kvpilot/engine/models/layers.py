"""Layers shared by the decoder families: RMSNorm, rotary embedding, SiLU-and-mul MLP, the decoder stack."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from kvpilot.engine.kernels import rmsnorm, rotary, silu_mul
from kvpilot.engine.layers.parallel import MergedLinear, column_linear, embedding, row_linear


class RMSNorm(nn.Module):
    """RMS normalisation computed in fp32, as HF does."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # packed tokens: the Triton kernel on CUDA (kernels/rmsnorm/)
            return rmsnorm(x, self.weight, self.eps)[0]
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual) in one pass: the residual add fused into the norm."""
        return rmsnorm(x, self.weight, self.eps, residual)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies of the rotary embedding, with llama3-style scaling when configured."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv_freq
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE applied to packed q [T, H, D] and k [T, Hkv, D] at given positions."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, scaling), persistent=False)
        self.query_tap: torch.Tensor | None = None  # [R, H, D]: the first R rotated q rows (cuda_graphs.QueryTap)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, store: tuple[torch.Tensor, ...] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # kernels/rotary/: Triton on CUDA, the reference elsewhere; `store` (Attention.fused_store) writes the
        # rotated k and v into the paged cache in the same kernel
        return rotary(positions, self.inv_freq, q, k, self.query_tap, store)


class SiluAndMulMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), HF parameter names."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = column_linear(hidden_size, intermediate_size, False)  # nn.Linear at one rank
        self.up_proj = column_linear(hidden_size, intermediate_size, False)
        self.down_proj = row_linear(intermediate_size, hidden_size, False)  # all-reduced under TP
        self.gate_up: MergedLinear | None = None  # merge_projections(): gate and up in one GEMM

    def merge_projections(self) -> None:
        self.gate_up = MergedLinear([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x) if self.gate_up is not None else (self.gate_proj(x), self.up_proj(x))
        return self.down_proj(silu_mul(gate, up))  # kernels/silu_mul/


class DecoderStack(nn.Module):
    """embed_tokens -> decoder layers -> final norm: the `model.*` part of every family (HF names).

    Each layer is called as `layer(positions, x)`, or, where it has one, as `layer.forward_carry(positions,
    normed, x, next_norm) -> (next normed, x)`: `x` is the residual stream, `normed` its input norm already
    applied, and the layer applies `next_norm` (the next carry layer's input norm, or the final norm) to its
    own output sum in the same pass as the residual add (vLLM's fused add-norm; the values are the same),
    or returns (None, x) when `next_norm` is None. So no layer launches an add, and a layer may fuse its last
    projection with the next norm (LlamaDecoderLayer, kernels/gemv_norm).
    """

    def __init__(self, vocab_size: int, hidden_size: int, eps: float, layers: Iterable[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = embedding(vocab_size, hidden_size)  # vocab-parallel under TP
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden_size, eps)

    def _next_norm(self, index: int) -> RMSNorm | None:
        if index + 1 == len(self.layers):
            return self.norm
        nxt = self.layers[index + 1]
        return nxt.input_layernorm if hasattr(nxt, "forward_carry") else None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        normed: torch.Tensor | None = None  # x under the next carry layer's input norm, when already formed
        for i, layer in enumerate(self.layers):
            carry = getattr(layer, "forward_carry", None)
            if carry is None:
                x, normed = layer(positions, x), None
                continue
            if normed is None:
                normed = layer.input_layernorm(x)
            normed, x = carry(positions, normed, x, self._next_norm(i))
        return normed if normed is not None else self.norm(x)
