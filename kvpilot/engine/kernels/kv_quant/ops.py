"""8-bit KV cache ops, dispatched to the Triton kernel or the torch reference (`KVPILOT_KERNELS`).

Triton is imported only when a Triton kernel runs, as in `kvpilot.engine.kernels`.
"""

from __future__ import annotations

import torch

from kvpilot.engine.kernels.dispatch import backend_for
from kvpilot.engine.kernels.kv_quant.qk_policy import int8_scores
from kvpilot.engine.kernels.kv_quant.reference import (
    paged_attention_decode_quant_reference,
    store_kvcache_quant_reference,
)


def store_kvcache_quant(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Quantise key/value [N, Hkv, D] into int8/fp8 caches at slot_mapping (-1 skips)."""
    if backend_for(key) == "triton":
        from kvpilot.engine.kernels.kv_quant.store import store_kvcache_quant_triton

        store_kvcache_quant_triton(key, value, k_cache, v_cache, k_scale, v_scale, slot_mapping)
    else:
        store_kvcache_quant_reference(key, value, k_cache, v_cache, k_scale, v_scale, slot_mapping)


def paged_attention_decode_quant(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence q [B, Hq, D] over an int8/fp8 paged cache, dequantised in-kernel.

    int8 caches score against the int8-rounded query on both backends (the kernel's default).
    """
    if backend_for(q) == "triton":
        from kvpilot.engine.kernels.kv_quant.decode import paged_attention_decode_quant_triton

        return paged_attention_decode_quant_triton(q, k_cache, v_cache, k_scale, v_scale, block_tables, context_lens, scale)
    return paged_attention_decode_quant_reference(q, k_cache, v_cache, k_scale, v_scale, block_tables, context_lens, scale,
                                                  int8_qk=int8_scores(k_cache.dtype, q.shape[-1]))
