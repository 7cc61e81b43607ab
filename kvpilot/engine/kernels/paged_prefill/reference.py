"""Pure-torch reference (fp32 math): causal varlen attention over a paged KV cache."""

from __future__ import annotations

import torch


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """The first context_len token rows [L, Hkv, D] of one sequence, gathered from its blocks."""
    block_size = cache.shape[1]
    num_blocks = -(-context_len // block_size)
    blocks = block_table[:num_blocks].long()
    return cache[blocks].reshape(num_blocks * block_size, *cache.shape[2:])[:context_len]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int = 0) -> torch.Tensor:
    """q [n, Hq, D] are the last n positions of a context k/v [L, Hkv, D]; causal, GQA; fp32 out.
    window > 0: sliding-window attention, the query at p sees keys p - window < j <= p (HF Mistral)."""
    n, num_heads, _ = q.shape
    context_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    q_pos = torch.arange(context_len - n, context_len, device=q.device)[:, None]
    k_pos = torch.arange(context_len, device=q.device)[None, :]
    hidden = k_pos > q_pos
    if window > 0:
        hidden |= k_pos <= q_pos - window
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


def paged_attention_prefill_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """q [T, Hq, D] packed; sequence b's queries are the last cu[b+1]-cu[b] positions of its context
    (window > 0: each sees only its last `window` positions, itself included)."""
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    for b, context_len in enumerate(context_lens.tolist()):
        start, end = cu[b], cu[b + 1]
        if end == start:
            continue
        k = gather_context(k_cache, block_tables[b], context_len)
        v = gather_context(v_cache, block_tables[b], context_len)
        out[start:end] = attend(q[start:end], k, v, scale, window).to(q.dtype)
    return out
