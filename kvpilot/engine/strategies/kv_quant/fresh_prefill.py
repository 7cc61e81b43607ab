"""Prefill over an 8-bit cache when no chunk of the step has cached context: attend over the step's own K/V.

A chunk that starts at position 0 attends only to the tokens of this step, which the layer holds in 16 bits.
Dequantising them back from the 8-bit cache (kernels/kv_quant/prefill.py, needed when a prefix or an earlier
chunk is cached) costs a pass over every block the chunks touch and attends to rounded values; here they are
written, as they are, into a compact 16-bit buffer laid out as paged blocks (each chunk's blocks consecutive,
`fresh_layout`), and the base paged prefill kernel runs over it. The values attended are then exactly those of
a 16-bit cache; decode steps still read the 8-bit cache. All on the device: no host sync, no per-chunk loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvpilot.engine.kernels import paged_attention_prefill, store_kvcache


@dataclass(frozen=True)
class FreshLayout:
    """Where each token of the step's chunks sits in the compact buffer."""

    slots: torch.Tensor  # int32 [T]: buffer row (block * block_size + offset) of each packed token
    tables: torch.Tensor  # int32 [B, W]: buffer block of each chunk's logical block, -1 past its end
    num_blocks: int  # buffer blocks: an upper bound known on the host (T // block_size + B)


def fresh_layout(cu_seqlens_q: torch.Tensor, num_tokens: int, width: int, block_size: int) -> FreshLayout:
    """Chunks packed by cu_seqlens_q int32 [B+1] (each from position 0) -> their blocks, consecutive per chunk.

    `width`: the block tables' width (>= each chunk's block count, since a chunk's blocks are all in its table)."""
    device = cu_seqlens_q.device
    cu = cu_seqlens_q.to(torch.int64)
    batch = cu.numel() - 1
    blocks = (cu[1:] - cu[:-1] + block_size - 1) // block_size
    first = torch.cumsum(blocks, 0) - blocks  # each chunk's first buffer block
    j = torch.arange(width, device=device)
    tables = torch.where(j[None, :] < blocks[:, None], first[:, None] + j[None, :], -1).to(torch.int32)
    token = torch.arange(num_tokens, device=device)
    chunk = torch.searchsorted(cu[1:], token, right=True)
    offset = token - cu[chunk]
    slots = ((first[chunk] + offset // block_size) * block_size + offset % block_size).to(torch.int32)
    return FreshLayout(slots, tables, num_tokens // block_size + batch)


def fresh_prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: FreshLayout, cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor, block_size: int, scale: float, max_seqlen_q: int | None,
) -> torch.Tensor:
    """Causal attention of chunks q [T, Hq, D] over their own k/v [T, Hkv, D] (16-bit), in q's dtype."""
    shape = (layout.num_blocks, block_size, k.shape[1], k.shape[2])
    k_buf = torch.empty(shape, dtype=q.dtype, device=q.device)
    v_buf = torch.empty(shape, dtype=q.dtype, device=q.device)
    store_kvcache(k.to(q.dtype), v.to(q.dtype), k_buf, v_buf, layout.slots)
    return paged_attention_prefill(q, k_buf, v_buf, layout.tables, cu_seqlens_q, context_lens, scale, max_seqlen_q)
