"""Attention and KV-cache ops, each dispatched to its Triton kernel or its pure-torch reference.

`KVPILOT_KERNELS=triton|torch` forces a backend; by default CUDA tensors take the Triton kernels
and CPU tensors the torch references. Triton is imported only when a Triton kernel runs, so the
torch path works on machines without triton.
"""

from __future__ import annotations

import torch

from kvpilot.engine.kernels.dispatch import backend_for
from kvpilot.engine.kernels.gemv_norm import MAX_ROWS as GEMV_NORM_MAX_ROWS
from kvpilot.engine.kernels.paged_decode.reference import paged_attention_decode_reference
from kvpilot.engine.kernels.paged_prefill.reference import paged_attention_prefill_reference
from kvpilot.engine.kernels.rmsnorm.reference import rmsnorm_reference
from kvpilot.engine.kernels.rotary.reference import rotary_reference
from kvpilot.engine.kernels.silu_mul.reference import silu_mul_reference
from kvpilot.engine.kernels.store_kvcache.reference import store_kvcache_reference

__all__ = [
    "linear_add_rmsnorm", "paged_attention_decode", "paged_attention_prefill", "rmsnorm", "rotary", "silu_mul",
    "store_kvcache",
]  # fmt: skip


def rotary(
    positions: torch.Tensor, inv_freq: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
    query_tap: torch.Tensor | None = None, store: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Rotate-half RoPE of q [T, H, D] and k [T, Hkv, D] at positions [T] (new tensors). query_tap [R, H, D]
    (optional) also receives the rotated q of the first min(T, R) tokens (worker/cuda_graphs.QueryTap).
    store (v, k_cache, v_cache, slot_mapping), optional: the rotated k and v are also written into the paged
    16-bit caches, as `store_kvcache` would (in the same kernel on the Triton path)."""
    half = inv_freq.numel()
    fits = q.dim() == 3 and k.dim() == 3 and q.shape[-1] == k.shape[-1] == 2 * half and half & (half - 1) == 0
    if fits and q.stride(-1) == 1 and k.stride(-1) == 1 and backend_for(q) == "triton":
        from kvpilot.engine.kernels.rotary.launcher import rotary_triton

        return rotary_triton(positions.contiguous(), inv_freq.contiguous(), q, k, query_tap, store)  # type: ignore[arg-type]
    q_out, k_out = rotary_reference(positions, inv_freq, q, k)
    if query_tap is not None:
        rows = min(q_out.shape[0], query_tap.shape[0])
        query_tap[:rows].copy_(q_out[:rows])
    if store is not None:
        v, k_cache, v_cache, slots = store
        store_kvcache(k_out, v, k_cache, v_cache, slots)
    return q_out, k_out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for [T, N] activations."""
    if gate.dim() == 2 and gate.stride(1) == 1 and up.stride(1) == 1 and backend_for(gate) == "triton":
        from kvpilot.engine.kernels.silu_mul.launcher import silu_mul_triton

        return silu_mul_triton(gate, up)
    return silu_mul_reference(gate, up)


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * rmsnorm(x + residual), x + residual) over the last dim of x [T, N]; without a residual, sum is x."""
    if backend_for(x) == "triton" and x.dim() == 2:
        from kvpilot.engine.kernels.rmsnorm.launcher import rmsnorm_triton

        return rmsnorm_triton(x, weight, eps, residual)
    return rmsnorm_reference(x, weight, eps, residual)


def linear_add_rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
    silu_input: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """rmsnorm(x @ weight.T, norm_weight, eps, residual) (with x = [gate | up] -> silu(gate) * up first when
    silu_input): one Triton launch for a few rows (kernels/gemv_norm), else the separate ops."""
    if backend_for(x) == "triton" and x.dim() == 2 and x.shape[0] <= GEMV_NORM_MAX_ROWS:
        from kvpilot.engine.kernels.gemv_norm.launcher import linear_add_rmsnorm_triton

        return linear_add_rmsnorm_triton(x, weight, residual, norm_weight, eps, silu_input)
    if silu_input:
        gate, up = x.chunk(2, dim=-1)
        x = silu_mul(gate, up)
    return rmsnorm(torch.nn.functional.linear(x, weight), norm_weight, eps, residual)


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [N, Hkv, D] into the paged caches at slot_mapping [N] (int32; -1 skips the row)."""
    if backend_for(key) == "triton":
        from kvpilot.engine.kernels.store_kvcache.launcher import store_kvcache_triton

        store_kvcache_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        store_kvcache_reference(key, value, k_cache, v_cache, slot_mapping)


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_seqlen_q: int | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Causal attention of packed chunks q [T, Hq, D] over their whole paged context (prefix + chunk).

    `max_seqlen_q`, optional: the longest chunk (a host int); it lets the Triton launch skip
    programs for tiles no sequence has. Omitting it is always correct. `window` > 0: sliding-window
    attention (the query at position p sees keys p - window < j <= p, as HF Mistral defines it).
    """
    if backend_for(q) == "triton":
        from kvpilot.engine.kernels.paged_prefill.launcher import paged_attention_prefill_triton

        return paged_attention_prefill_triton(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q, window
        )
    return paged_attention_prefill_reference(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, window
    )


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """One query per sequence q [B, Hq, D] at position context_lens[b]-1 over its paged context
    (window > 0: over its last `window` positions)."""
    if backend_for(q) == "triton":
        from kvpilot.engine.kernels.paged_decode.launcher import paged_attention_decode_triton

        return paged_attention_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale, window=window)
    return paged_attention_decode_reference(q, k_cache, v_cache, block_tables, context_lens, scale, window)
