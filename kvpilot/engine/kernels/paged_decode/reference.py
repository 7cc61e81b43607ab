"""Pure-torch reference (fp32 math): one query per sequence over its paged KV context."""

from __future__ import annotations

import torch

from kvpilot.engine.kernels.paged_prefill.reference import attend, gather_context


def paged_attention_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """q [B, Hq, D]; sequence b's query sits at position context_lens[b]-1 and sees its whole context
    (window > 0: its last `window` positions)."""
    out = torch.empty_like(q)
    for b, context_len in enumerate(context_lens.tolist()):
        k = gather_context(k_cache, block_tables[b], context_len)
        v = gather_context(v_cache, block_tables[b], context_len)
        out[b] = attend(q[b : b + 1], k, v, scale, window)[0].to(q.dtype)
    return out
