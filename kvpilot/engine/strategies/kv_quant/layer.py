"""The engine's 8-bit KV caches (int8, fp8 e4m3) and the 16-bit/int8 pools of `kv_cache_dtype=auto`.

worker/kv_cache.py allocates, per layer, beside (or instead of) the 16-bit K/V: int8/fp8 K/V
`[n8, block_size, Hkv, D]` (V stored dim-major within a block: kernels/kv_quant/layout.py) and their scales (int8: fp32 `[n8, block_size, Hkv]` per token and head,
written by the store; fp8: fp32 `[Hkv]` per layer, calibrated from the layer's first write and then
fixed, see docs/strategies.md). Each Attention layer gets a `LayerKVQuant` that replaces its
store + attend: the quantising store, decode with in-kernel dequantisation, and prefill through the
block-dequant path (kernels/kv_quant). With two pools (auto switching, or int8/fp8 with a 16-bit
fallback reserve) the 8-bit pool's block ids start at n16 (`first8`). The runner counts the step's
sequences in the 16-bit pool on the host (`Context.exact_pool_seqs`, layers/pool_split.py): when none is
there, or all are, the step's metadata is used as it is (8-bit ids rebased on the device), with no
host sync, so CUDA graphs capture it; only a step with sequences in both pools is split by pool on
the host (layers/pool_split.py).
"""

from __future__ import annotations

import torch

from kvpilot.engine.context import Context
from kvpilot.engine.kernels import paged_attention_decode, paged_attention_prefill, store_kvcache
from kvpilot.engine.kernels.kv_quant.ops import paged_attention_decode_quant, store_kvcache_quant
from kvpilot.engine.kernels.kv_quant.reference import calibrate_fp8_scale
from kvpilot.engine.layers.pool_split import PoolPart, split_step


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
                    part.context_lens, scale, part.max_seqlen_q,
                )
            return paged_attention_decode_quant(
                q, self.k8, self.v8, self.k_scale, self.v_scale, part.block_tables, part.context_lens, scale
            )
        kc, vc = attn.k_cache, attn.v_cache
        q16 = q.to(kc.dtype)
        if part.prefill:
            o = paged_attention_prefill(q16, kc, vc, part.block_tables, part.cu_seqlens_q, part.context_lens, scale,
                                        part.max_seqlen_q)  # fmt: skip
        else:
            o = paged_attention_decode(q16, kc, vc, part.block_tables, part.context_lens, scale)
        return o.to(q.dtype)
