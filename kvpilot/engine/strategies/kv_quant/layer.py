"""The engine's 8-bit KV caches (int8, fp8 e4m3) and the 16-bit/int8 pools of `kv_cache_dtype=auto`.

worker/kv_cache.py allocates, per layer, beside (or instead of) the 16-bit K/V: int8/fp8 K/V
`[n8, block_size, Hkv, D]` (V stored dim-major within a block: kernels/kv_quant/layout.py) and their scales (int8: fp32 `[n8, block_size, Hkv]` per token and head,
written by the store; fp8: fp32 `[Hkv]` per layer, calibrated from the layer's first write and then
fixed, see docs/strategies.md). Each Attention layer gets a `LayerKVQuant` that replaces its
store + attend: the quantising store, decode with in-kernel dequantisation, and prefill through the
block-dequant path (kernels/kv_quant). With two pools (auto switching, or int8/fp8 with a 16-bit
fallback reserve) the 8-bit pool's block ids start at n16 (`first8`). The runner counts the step's
sequences in the 16-bit pool on the host (`Context.exact_pool_seqs`, `split_step`): when none is
there, or all are, the step's metadata is used as it is (8-bit ids rebased on the device), with no
host sync, so CUDA graphs capture it; only a step with sequences in both pools is split by pool on
the host (`split_by_pool`, one small host copy of the step's metadata).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvpilot.engine.context import Context
from kvpilot.engine.kernels import paged_attention_decode, paged_attention_prefill, store_kvcache
from kvpilot.engine.kernels.kv_quant.ops import paged_attention_decode_quant, store_kvcache_quant
from kvpilot.engine.kernels.kv_quant.reference import calibrate_fp8_scale


@dataclass
class PoolPart:
    """Rows of one step's packed tokens that attend over one pool with one kernel."""

    prefill: bool
    quant: bool
    rows: slice | torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor | None = None


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
                              ctx.cu_seqlens_q))  # fmt: skip
    if n < num_tokens:
        parts.append(PoolPart(False, True, slice(n, num_tokens), _rebase(ctx.decode_block_tables, first8),
                              ctx.decode_context_lens))  # fmt: skip
    return KVSplit(None, _rebase(ctx.slot_mapping, first8 * block_size), parts)


def split_all_exact(ctx: Context, num_tokens: int) -> KVSplit:
    """Every sequence on the 16-bit pool (ids [0, first8): no rebase): the step's metadata as it is."""
    n = ctx.num_prefill_tokens
    parts = []
    if n:
        parts.append(PoolPart(True, False, slice(0, n), ctx.block_tables, ctx.context_lens, ctx.cu_seqlens_q))
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


class LayerKVQuant:
    """One layer's 8-bit K/V and scales; stores and attends for every token of a step."""

    def __init__(
        self, mode: str, k8: torch.Tensor, v8: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
        first8: int, block_size: int,
    ) -> None:
        self.mode = mode
        self.k8, self.v8, self.k_scale, self.v_scale = k8, v8, k_scale, v_scale
        self.first8 = first8  # 8-bit pool block ids start here (0: every block is 8-bit)
        self.block_size = block_size
        self.calibrated = mode != "fp8"

    def forward(self, attn: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                ctx: Context) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] of the step -> attention output [T, Hq, D] in q's dtype."""
        split = ctx.kv_split
        if split is None:  # computed by the first layer, shared by the rest
            split = ctx.kv_split = split_step(ctx, q.shape[0], self.first8, self.block_size)
        if split.slots16 is not None:
            dtype16 = attn.k_cache.dtype
            store_kvcache(k.to(dtype16), v.to(dtype16), attn.k_cache, attn.v_cache, split.slots16)
        if split.slots8 is not None:
            self._store(k, v, split.slots8, ctx.graph_static)
        if len(split.parts) == 1 and isinstance(split.parts[0].rows, slice):
            return self._attend(attn, q, split.parts[0])
        out = torch.empty_like(q)
        for part in split.parts:
            out[part.rows] = self._attend(attn, q[part.rows], part)
        return out

    def _store(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, graph_static: bool) -> None:
        # fp8: calibrate on the layer's first real write, an eager prefill; a CUDA-graph step (capture, or its
        # padded eager twin) stores with the scale tensors as they are and is only ever replayed after that
        if not self.calibrated and not graph_static:
            written = slots >= 0
            self.k_scale.copy_(calibrate_fp8_scale(k[written]))
            self.v_scale.copy_(calibrate_fp8_scale(v[written]))
            self.calibrated = True
        store_kvcache_quant(k, v, self.k8, self.v8, self.k_scale, self.v_scale, slots)

    def _attend(self, attn: torch.nn.Module, q: torch.Tensor, part: PoolPart) -> torch.Tensor:
        scale = attn.scale
        if part.quant:
            if part.prefill:
                from kvpilot.engine.kernels.kv_quant.prefill import paged_attention_prefill_quant

                return paged_attention_prefill_quant(
                    q, self.k8, self.v8, self.k_scale, self.v_scale, part.block_tables, part.cu_seqlens_q,
                    part.context_lens, scale,
                )
            return paged_attention_decode_quant(
                q, self.k8, self.v8, self.k_scale, self.v_scale, part.block_tables, part.context_lens, scale
            )
        kc, vc = attn.k_cache, attn.v_cache
        q16 = q.to(kc.dtype)
        if part.prefill:
            o = paged_attention_prefill(q16, kc, vc, part.block_tables, part.cu_seqlens_q, part.context_lens, scale)
        else:
            o = paged_attention_decode(q16, kc, vc, part.block_tables, part.context_lens, scale)
        return o.to(q.dtype)
