"""A step's tokens split by KV pool: the rows, block tables and lengths that attend over each pool.

Shared by every two-pool cache: the 16-bit + 8-bit pools of kv_quant (auto switching, int8/fp8 with
a 16-bit reserve) and a conversion's fallback reserve (layers/reserve_attention.py). The runner
counts the step's sequences in the exact (first) pool on the host (`Context.exact_pool_seqs`): when
none is there, or all are, the step's metadata is used as it is (the second pool's ids rebased on
the device), with no host sync, so CUDA graphs capture it; only a step with sequences in both pools
is split by pool on the host (`split_by_pool`, one small host copy of the step's metadata).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvpilot.engine.context import Context


@dataclass
class PoolPart:
    """Rows of one step's packed tokens that attend over one pool with one kernel."""

    prefill: bool
    quant: bool
    rows: slice | torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor | None = None
    max_seqlen_q: int | None = None  # the part's longest prefill chunk (host int), or None: not known


@dataclass
class KVSplit:
    """A step's tokens by pool: store slots per pool and the attention parts."""

    slots16: torch.Tensor | None
    slots8: torch.Tensor | None
    parts: list[PoolPart]


def split_step(ctx: Context, num_tokens: int, first8: int, block_size: int) -> KVSplit:
    """The step's tokens by pool, without a host sync unless sequences of both pools share the step."""
    if first8 == 0:
        return split_all_quant(ctx, num_tokens)
    exact = ctx.exact_pool_seqs
    if exact == 0:
        return split_all_quant(ctx, num_tokens, first8, block_size)
    if exact is not None and exact == num_sequences(ctx):
        return split_all_exact(ctx, num_tokens)
    return split_by_pool(ctx, num_tokens, first8, block_size)


def num_sequences(ctx: Context) -> int:
    """Prefill chunks plus decodes of the step (from tensor shapes: no host sync)."""
    prefill = ctx.block_tables.shape[0] if ctx.num_prefill_tokens else 0
    return prefill + (ctx.decode_block_tables.shape[0] if ctx.decode_block_tables is not None else 0)


def split_all_quant(ctx: Context, num_tokens: int, first8: int = 0, block_size: int = 0) -> KVSplit:
    """Every sequence on the 8-bit pool: the step's metadata as it is, block ids and slots rebased by
    `first8` blocks on the device (a two-pool cache; padding -1 stays -1). No host copy."""
    n = ctx.num_prefill_tokens
    parts = []
    if n:
        parts.append(PoolPart(True, True, slice(0, n), _rebase(ctx.block_tables, first8), ctx.context_lens,
                              ctx.cu_seqlens_q, ctx.max_seqlen_q))  # fmt: skip
    if n < num_tokens:
        parts.append(PoolPart(False, True, slice(n, num_tokens), _rebase(ctx.decode_block_tables, first8),
                              ctx.decode_context_lens))  # fmt: skip
    return KVSplit(None, _rebase(ctx.slot_mapping, first8 * block_size), parts)


def split_all_exact(ctx: Context, num_tokens: int) -> KVSplit:
    """Every sequence on the 16-bit pool (ids [0, first8): no rebase): the step's metadata as it is."""
    n = ctx.num_prefill_tokens
    parts = []
    if n:
        parts.append(PoolPart(True, False, slice(0, n), ctx.block_tables, ctx.context_lens, ctx.cu_seqlens_q,
                              ctx.max_seqlen_q))  # fmt: skip
    if n < num_tokens:
        parts.append(PoolPart(False, False, slice(n, num_tokens), ctx.decode_block_tables, ctx.decode_context_lens))
    return KVSplit(ctx.slot_mapping, None, parts)


def split_by_pool(ctx: Context, num_tokens: int, first8: int, block_size: int) -> KVSplit:
    """Sequences whose blocks are >= first8 are on the 8-bit pool (ids rebased to 0); reads the step's
    metadata on the host (a sync), so a CUDA graph cannot capture it."""
    device = ctx.slot_mapping.device
    slots = ctx.slot_mapping.cpu()
    boundary = first8 * block_size
    is8 = slots >= boundary
    minus = torch.full_like(slots, -1)
    slots16 = torch.where(is8 | (slots < 0), minus, slots)
    slots8 = torch.where(is8, slots - boundary, minus)
    parts: list[PoolPart] = []
    n = ctx.num_prefill_tokens
    if n:
        tables, lens = ctx.block_tables.cpu(), ctx.context_lens.cpu()
        cu = ctx.cu_seqlens_q.cpu().tolist()
        on8 = (tables[:, 0] >= first8).tolist()
        for quant in (False, True):
            seqs = [i for i, q in enumerate(on8) if q == quant]
            if not seqs:
                continue
            rows = torch.cat([torch.arange(cu[i], cu[i + 1]) for i in seqs])
            sub_cu = [0]
            for i in seqs:
                sub_cu.append(sub_cu[-1] + cu[i + 1] - cu[i])
            parts.append(PoolPart(
                True, quant, rows.to(device), _rebase(tables[seqs], first8 if quant else 0).to(device),
                lens[seqs].to(device), torch.tensor(sub_cu, dtype=torch.int32).to(device),
                max(cu[i + 1] - cu[i] for i in seqs),
            ))
    if n < num_tokens:
        tables, lens = ctx.decode_block_tables.cpu(), ctx.decode_context_lens.cpu()
        on8 = tables[:, 0] >= first8
        for quant in (False, True):
            idx = torch.nonzero(on8 == quant).flatten()
            if idx.numel():
                parts.append(PoolPart(
                    False, quant, (idx + n).to(device), _rebase(tables[idx], first8 if quant else 0).to(device),
                    lens[idx].to(device),
                ))
    return KVSplit(slots16.to(device), slots8.to(device), parts)


def _rebase(ids: torch.Tensor, first: int) -> torch.Tensor:
    """Block ids (or slots) less `first`, -1 padding kept: on the device, no sync (ids as they are for 0)."""
    if first == 0:
        return ids
    return torch.where(ids >= 0, ids - first, ids).contiguous()
