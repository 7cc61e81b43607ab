"""Paged attention over a latent cache `[num_blocks, block_size, width]`: one row per token and layer.

Used by native DeepSeek MLA (row = c_kv after kv_a_layernorm ; k_pe after RoPE, width
kv_lora_rank + qk_rope_head_dim, the layout of kernels/mla_decode) and by the MLA conversion of
MHA/GQA checkpoints (row = the SVD latent, width latent_rank). The caller supplies `expand`, which
turns cached rows back into per-head K and V (prefill decompresses; correctness over speed, torch),
and optionally `decode`, an absorbed single-token path over the cache (DeepSeek: the mla_decode
kernel). Block tables, chunked prefill, prefix caching and preemption are as for K/V blocks: the
cache is addressed by the same slot mapping.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot.engine.context import get_context
from kvpilot.engine.kernels.mla_decode.reference import gather_latent

# rows [n, width], positions [n] -> key [n, Hk, Dq], value [n, Hk, Dv]
Expand = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# q [B, H, Dq], cache, block_tables [B, W], context_lens [B] -> [B, H, Dv]
Decode = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class LatentAttention(nn.Module):
    """Stores this step's latent rows, then attends prefill chunks and decodes over the cache."""

    def __init__(self, num_heads: int, width: int, scale: float, rope_split: int | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.width = width
        self.scale = scale
        self.rope_split = rope_split  # DeepSeek: rows are [c_kv (rope_split) ; k_pe], stored by store_latent
        self.kv_cache = torch.empty(0)

    def forward(
        self,
        q: torch.Tensor,
        latent: torch.Tensor,
        positions: torch.Tensor,
        expand: Expand,
        decode: Decode | None = None,
    ) -> torch.Tensor:
        """q [T, H, Dq], latent [T, width] at `positions` -> attention output [T, H, Dv]."""
        ctx = get_context()
        if ctx.dense:  # scoring / profiling: no cache, causal over the packed tokens
            k, v = expand(latent, positions)
            return _attend(q, k, v, self.scale, q.shape[0])
        cache = self.kv_cache
        self._store(latent.to(cache.dtype), ctx.slot_mapping)
        n_prefill = ctx.num_prefill_tokens
        outs = []
        if n_prefill:
            outs.append(
                attend_paged(
                    q[:n_prefill],
                    cache,
                    ctx.block_tables,
                    ctx.cu_seqlens_q,
                    ctx.context_lens,
                    expand,
                    self.scale,
                )
            )
        if n_prefill < q.shape[0]:
            q_dec = q[n_prefill:]
            if decode is not None:
                outs.append(decode(q_dec, cache, ctx.decode_block_tables, ctx.decode_context_lens))
            else:
                cu = torch.arange(q_dec.shape[0] + 1, dtype=torch.int32, device=q.device)
                outs.append(
                    attend_paged(
                        q_dec, cache, ctx.decode_block_tables, cu, ctx.decode_context_lens, expand, self.scale
                    )
                )
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _store(self, latent: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Rows into the cache at slot_mapping (-1 skips): on CUDA the store_latent kernel, with no
        boolean mask (a mask costs a host sync per layer and cannot be captured in a CUDA graph)."""
        from kvpilot.engine.kernels.mla_decode.ops import store_latent

        split = self.rope_split if self.rope_split is not None else self.width
        store_latent(latent[:, :split], latent[:, split:], self.kv_cache, slot_mapping)


def attend_paged(
    q: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    expand: Expand,
    scale: float,
) -> torch.Tensor:
    """Each sequence's queries (the last of its context_len tokens) over its decompressed cache rows."""
    cu = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    outs = []
    for i, context_len in enumerate(lens):
        rows = gather_latent(cache, block_tables[i], context_len)
        k, v = expand(rows.to(q.dtype), torch.arange(context_len, device=q.device))
        outs.append(_attend(q[cu[i] : cu[i + 1]], k, v, scale, context_len))
    return torch.cat(outs)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, context_len: int
) -> torch.Tensor:
    """q [n, H, Dq] are the last n of context_len positions; k [c, Hk, Dq], v [c, Hk, Dv] -> [n, H, Dv]."""
    n, heads = q.shape[0], q.shape[1]
    if k.shape[1] != heads:  # GQA: query head h reads KV head h // (H / Hk), as HF's repeat_kv
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    q_pos = torch.arange(context_len - n, context_len, device=q.device)
    mask = q_pos[:, None] >= torch.arange(context_len, device=q.device)[None, :]
    out = F.scaled_dot_product_attention(  # 4-D: the fused SDPA kernels take no 3-D inputs (see Attention)
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask, scale=scale
    )
    return out[0].transpose(0, 1)
