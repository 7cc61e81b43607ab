"""The attention layer: writes this step's K/V into the paged cache, then attends over it."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot.engine.context import Context, get_context
from kvpilot.engine.kernels import paged_attention_decode, paged_attention_prefill, store_kvcache


class Attention(nn.Module):
    """Paged attention over one layer's k_cache/v_cache [num_blocks, block_size, Hkv, D]."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.kv_quant: Any = None  # strategies/kv_quant/layer.LayerKVQuant when the cache is int8/fp8/auto-switched
        # sliding-window attention (Mistral's `sliding_window`): each query sees its last `window` positions;
        # 0: the whole context. The 16-bit paged and dense paths apply it; elsewhere the engine keeps
        # max_model_len within the window (config/sliding_window.py), where it changes nothing.
        self.window = 0

    def fused_store(self, v: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """(v, k_cache, v_cache, slot_mapping) where this step's K/V can be written by the rotary kernel
        (kernels.rotary's `store`): the plain 16-bit paged path in the activations' dtype; else None, and
        forward stores them. The caller then calls forward with stored=True."""
        ctx = get_context()
        if ctx.dense or self.kv_quant is not None or ctx.slot_mapping is None:
            return None
        kc, vc = self.k_cache, self.v_cache
        if kc.dim() != 4 or kc.dtype != v.dtype or not (kc.is_contiguous() and vc.is_contiguous()):
            return None
        return v, kc, vc, ctx.slot_mapping

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, stored: bool = False) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]; stored: k/v are in the cache already (fused_store)."""
        ctx = get_context()
        if ctx.dense:
            return self._dense_causal(q, k, v)
        if self.kv_quant is not None:
            return self.kv_quant.forward(self, q, k, v, ctx)
        out_dtype, cache_dtype = q.dtype, self.k_cache.dtype
        if cache_dtype != out_dtype:  # kv_cache_dtype differs from the model's: attend in the cache's
            q, k, v = q.to(cache_dtype), k.to(cache_dtype), v.to(cache_dtype)
        if not stored:
            store_kvcache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        n_prefill = ctx.num_prefill_tokens
        if n_prefill == q.shape[0]:
            o = self._prefill(q, ctx)
        elif n_prefill == 0:
            o = self._decode(q, ctx)
        else:  # a mixed step: chunks through the varlen kernel, decodes through the decode kernel
            o = torch.empty_like(q)
            o[:n_prefill] = self._prefill(q[:n_prefill], ctx)
            o[n_prefill:] = self._decode(q[n_prefill:], ctx)
        return o.to(out_dtype)

    def _prefill(self, q: torch.Tensor, ctx: Context) -> torch.Tensor:
        return paged_attention_prefill(
            q, self.k_cache, self.v_cache, ctx.block_tables, ctx.cu_seqlens_q, ctx.context_lens, self.scale,
            ctx.max_seqlen_q, self.window,
        )

    def _decode(self, q: torch.Tensor, ctx: Context) -> torch.Tensor:
        return paged_attention_decode(
            q, self.k_cache, self.v_cache, ctx.decode_block_tables, ctx.decode_context_lens, self.scale, self.window
        )

    def _dense_causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        # 4-D [1, H, T, D]: SDPA's flash / memory-efficient kernels take only 4-D inputs; 3-D fell back to the
        # math kernel, whose [H, T, T] scores took 32 GiB at 16k tokens (runtime validation's dense recompute)
        q4, k4, v4 = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
        t = q.shape[0]
        if self.window and t > self.window:  # the band p - window < j <= p (a [T, T] mask, only past the window)
            pos = torch.arange(t, device=q.device)
            band = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - self.window)
            return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=band, scale=self.scale)[0].transpose(0, 1)
        out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=self.scale)
        return out[0].transpose(0, 1)
