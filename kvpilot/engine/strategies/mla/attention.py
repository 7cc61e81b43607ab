"""MLA conversion of a loaded Llama/Mistral/Qwen2 model: K/V through one shared SVD latent per layer.

`convert_to_mla(model, rank)` (convert.py) replaces every layer's `self_attn` by `ConvertedMlaAttention`: the
latent c = down x (width `rank`) is what the paged cache holds; attention reconstructs
K = up_k c (+ bias), applies RoPE at each cached token's position, and V = up_v c (+ bias), then runs
causal softmax attention (layers/latent_attention.LatentAttention). All head dims are factorised (rope_dims 0
in strategies/mla/svd.py): these checkpoints were trained with RoPE on every dim, so the
reconstructed key is rotated at attention time and W_UK is not absorbed (see docs/strategies.md).
Decode runs batched with W_UV absorbed: on CUDA (and under TRITON_INTERPRET) through the fused kernel
kernels/mla_conversion, which decompresses and rotates each KV head's keys a tile at a time inside the
program (no per-step plan on the host, so its steps replay as CUDA graphs); elsewhere, or for a head
dim the kernel cannot tile, through the torch path strategies/mla/decode.py. Prefill decompresses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot.engine.context import get_context
from kvpilot.engine.kernels.dispatch import backend_for
from kvpilot.engine.layers.latent_attention import LatentAttention
from kvpilot.engine.layers.reserve_attention import attend_with_reserve
from kvpilot.engine.models.llama import LlamaAttention
from kvpilot.engine.strategies.mla.absorbed import project_values
from kvpilot.engine.strategies.mla.decode import DecodePlanner, converted_mla_decode
from kvpilot.engine.strategies.mla.svd import MlaConversion

log = logging.getLogger("kvpilot.engine.mla")


class ConvertedMlaAttention(nn.Module):
    """q_proj, RoPE and o_proj of the source layer; K/V reconstructed from the cached latent."""

    def __init__(
        self, src: LlamaAttention, conv: MlaConversion, planner: DecodePlanner | None = None
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = src.num_heads, src.num_kv_heads, src.head_dim
        self.q_proj, self.o_proj, self.rotary_emb = src.q_proj, src.o_proj, src.rotary_emb
        dtype, device = src.k_proj.weight.dtype, src.k_proj.weight.device
        # row-major (the SVD's factors come column-major from LAPACK; the fused decode kernel reads rows)
        self.register_buffer("down", conv.down.to(device, dtype).contiguous())
        self.register_buffer("up_k", conv.up_k.to(device, dtype).contiguous())
        self.register_buffer("up_v", conv.up_v.to(device, dtype).contiguous())
        self.register_buffer("k_bias", None if src.k_proj.bias is None else src.k_proj.bias.detach().clone())
        self.register_buffer("v_bias", None if src.v_proj.bias is None else src.v_proj.bias.detach().clone())
        # the fused decode kernel's RoPE frequencies (fp32, as the model's rotary computes its angles)
        self.register_buffer("inv_freq", src.rotary_emb.inv_freq.detach().float().to(device).contiguous(),
                             persistent=False)  # fmt: skip
        self.attn = LatentAttention(self.num_heads, conv.rank, src.attn.scale)
        self.conversion = conv
        # The original projections stay for runtime validation's exact side (strategies/mla/check.py) and the
        # fallback reserve (layers/reserve_attention.py), where a failing sequence is served unconverted. They
        # cost weights, not KV memory.
        self.k_proj, self.v_proj = src.k_proj, src.v_proj
        self.force_exact = False
        # False once the decode kernel failed here (it does not compile or launch on this device): decode
        # then takes the torch path, whatever the backend
        self.kernel_decode = True
        # the step's gather index, padding mask and RoPE table, shared by the layers of one model
        self.planner = planner if planner is not None else DecodePlanner(src.rotary_emb.inv_freq)
        # False: decode decompresses each sequence's whole context (the prefill path), the former
        # decode kept as a reference for tests and bench/bench_mla_conversion_decode.py
        self.batched_decode = True

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        q_rot, _ = self.rotary_emb(positions, q, q[:, :1])
        if self.force_exact:  # dense recompute with the checkpoint's own K/V (validation)
            o = self.attn(q_rot, x, positions, self._expand_exact)
        elif getattr(self.attn, "first_latent", 0) and not get_context().dense:  # a fallback reserve beside
            o = attend_with_reserve(
                q_rot, x, positions, self.attn, self._expand_exact, self._reserve_latent, self.attn.kv_cache.shape[1]
            )
        else:
            o = self._serve(q, q_rot, x, positions)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))

    def _serve(self, q: torch.Tensor, q_rot: torch.Tensor, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The conversion's attention for query q before (q) and after RoPE (q_rot); here every dim rotates."""
        return self._latent(q_rot, x, positions)

    def _reserve_latent(self, q_rot: torch.Tensor, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The conversion's part of a step beside the fallback reserve, given the rotated query."""
        return self._latent(q_rot, x, positions)

    def _latent(self, q: torch.Tensor, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        decode = self._decode if self.batched_decode else None
        return self.attn(q, F.linear(x, self.down), positions, self._expand, decode)

    def _expand(self, rows: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = rows.shape[0]
        k = F.linear(rows, self.up_k, self.k_bias).view(n, self.num_kv_heads, self.head_dim)
        v = F.linear(rows, self.up_v, self.v_bias).view(n, self.num_kv_heads, self.head_dim)
        k, _ = self.rotary_emb(positions, k, k[:, :1])
        return k, v

    def _decode(
        self, q: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor
    ) -> torch.Tensor:
        if self.kernel_decode and backend_for(q) == "triton" and fused_decode_fits(
            self.head_dim, q.dtype, cache.dtype, self.up_k.dtype
        ):
            from kvpilot.engine.kernels.mla_conversion.kernel import mla_conversion_decode_triton

            o_latent = self.kernel_or_none(
                mla_conversion_decode_triton, q, cache, self.up_k, self.k_bias, self.inv_freq, block_tables,
                context_lens, self.attn.scale, self.num_kv_heads,
            )  # fmt: skip
            if o_latent is not None:
                return project_values(o_latent, self.up_v, self.v_bias, self.num_kv_heads)
        plan = self.planner.plan(block_tables, context_lens, cache.shape[1], q.dtype)
        rows = plan.gather(cache).to(q.dtype)
        return converted_mla_decode(
            q, rows, plan, self.up_k, self.k_bias, self.up_v, self.v_bias, self.num_kv_heads, self.attn.scale
        )

    def kernel_or_none(self, kernel: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor | None:
        """The decode kernel's result, or None after logging why it failed: a kernel that does not compile
        or launch on this device must not take the engine down when the torch path can serve (the engine's
        CUDA graph capture then fails on the torch path's host plan, and its steps stay eager)."""
        try:
            return kernel(*args)
        except Exception as exc:  # Triton's compile errors are no RuntimeErrors
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise  # inside a capture: let build_decode_graphs abandon it
            log.warning("mla decode kernel %s failed, decode takes the torch path from now on: %s: %s",
                        getattr(kernel, "__name__", kernel), type(exc).__name__, str(exc).splitlines()[0][:300])  # fmt: skip
            self.kernel_decode = False
            return None

    def _expand_exact(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        k, _ = self.rotary_emb(positions, k, k[:, :1])
        return k, v


def fused_decode_fits(head_dim: int, *dtypes: torch.dtype) -> bool:
    """kernels/mla_conversion tiles a head as two halves of a power-of-two width >= 16 (head_dim 32, 64,
    128, 256) and takes the query, the cache and W_UK in one dtype; otherwise decode takes the torch path."""
    half = head_dim // 2
    return head_dim % 2 == 0 and half >= 16 and half & (half - 1) == 0 and len(set(dtypes)) == 1
