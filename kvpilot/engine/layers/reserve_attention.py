"""A converted layer beside its fallback reserve: converted blocks for most sequences, unconverted K/V for the rest.

Used by the MLA conversion (strategies/mla/attention.py) and the GQA conversion
(strategies/gqa/reserve.py). With `fallback_reserve > 0` the pool holds two kinds of blocks in one
block-id space: K/V blocks of the unconverted layer (ids [0, first_latent): the reserve,
`reserve_k` / `reserve_v` on the layer's attention module) and converted blocks (an MLA latent row,
merged GQA heads; ids from first_latent, rebased to 0 in the layer's own cache). A step's tokens are
split by pool (layers/pool_split.split_step, computed once per step: a step with no reserve sequence,
the common case, only rebases block ids on the device; one with sequences in both pools is split on
the host): reserve tokens project K/V with the checkpoint's own k_proj / v_proj and attend over
paged K/V; the others run the conversion as before. Runtime validation moves a failing sequence to
the reserve, so from there it is served by the original attention.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvpilot.engine.context import Context, get_context, set_context
from kvpilot.engine.kernels import paged_attention_decode, paged_attention_prefill, store_kvcache
from kvpilot.engine.layers.pool_split import KVSplit, PoolPart, split_step

ExactKV = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # x, positions -> k, v
LatentPart = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # q, x, positions -> o


def step_split(ctx: Context, num_tokens: int, first_latent: int, block_size: int) -> KVSplit:
    """The step's tokens by pool, computed by the first layer and shared by the rest."""
    if ctx.kv_split is None:
        ctx.kv_split = split_step(ctx, num_tokens, first_latent, block_size)
    return ctx.kv_split


def attend_with_reserve(
    q: torch.Tensor,
    x: torch.Tensor,
    positions: torch.Tensor,
    attn: torch.nn.Module,
    exact_kv: ExactKV,
    latent_part: LatentPart,
    block_size: int,
) -> torch.Tensor:
    """q [T, H, D] (after RoPE), hidden x [T, hidden] -> [T, H, D]; reserve tokens exact, the rest through
    `latent_part` (the conversion's own path: an MLA latent, merged GQA heads) under a context of their own.
    `attn` holds `reserve_k` / `reserve_v` (the unconverted layer's paged K/V), `first_latent` and `scale`."""
    ctx = get_context()
    split = step_split(ctx, q.shape[0], attn.first_latent, block_size)
    slots16 = split.slots16
    if slots16 is not None:
        rows = torch.nonzero(slots16 >= 0).flatten()
        if rows.numel():
            k, v = exact_kv(x[rows], positions[rows])
            store_kvcache(k.to(attn.reserve_k.dtype), v.to(attn.reserve_v.dtype), attn.reserve_k, attn.reserve_v,
                          slots16[rows])  # fmt: skip
    out = torch.empty_like(q)
    for part in split.parts:
        if part.quant:  # the latent pool
            out[part.rows] = _latent(q, x, positions, part, split, latent_part, ctx)
        else:
            out[part.rows] = _exact(q[part.rows], part, attn).to(q.dtype)
    return out


def _exact(q: torch.Tensor, part: PoolPart, attn: torch.nn.Module) -> torch.Tensor:
    kc, vc = attn.reserve_k, attn.reserve_v
    q = q.to(kc.dtype)
    if part.prefill:
        return paged_attention_prefill(q, kc, vc, part.block_tables, part.cu_seqlens_q, part.context_lens, attn.scale,
                                       part.max_seqlen_q)  # fmt: skip
    return paged_attention_decode(q, kc, vc, part.block_tables, part.context_lens, attn.scale)


def _latent(
    q: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, part: PoolPart, split: KVSplit,
    latent_part: LatentPart, ctx: Context,
) -> torch.Tensor:
    """The part through the conversion's own path, under a context that describes only its tokens."""
    rows = part.rows
    assert split.slots8 is not None
    sub = Context(slot_mapping=split.slots8[rows])
    if part.prefill:
        sub.num_prefill_tokens = rows.stop - rows.start if isinstance(rows, slice) else rows.numel()  # no sync
        sub.block_tables, sub.cu_seqlens_q, sub.context_lens = part.block_tables, part.cu_seqlens_q, part.context_lens
        sub.max_seqlen_q = part.max_seqlen_q
    else:
        sub.decode_block_tables, sub.decode_context_lens = part.block_tables, part.context_lens
    set_context(sub)
    try:
        return latent_part(q[rows], x[rows], positions[rows])
    finally:
        set_context(ctx)
