"""Launcher for the RoPE kernel: checks the contract, then one launch: per token one program for k, one per 8 q heads."""

from __future__ import annotations

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.rotary.kernel import _rotary_kernel

Q_HEADS_PER_PROGRAM = 8  # query heads a program rotates; k (and the store) take one more program per token
KVStore = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # v [T, Hkv, D], k/v caches, slots [T]


def check_store(store: KVStore, k: torch.Tensor) -> None:
    """The store's contract: store_kvcache's (contiguous 16-bit caches in k's dtype, one slot per token)."""
    v, k_cache, v_cache, slots = store
    assert v.shape == k.shape and v.dtype == k.dtype and v.stride(2) == 1, f"v {tuple(v.shape)} must be k's shape"
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape and k_cache.shape[2:] == k.shape[1:], (
        f"caches must be [blocks, block_size, {k.shape[1]}, {k.shape[2]}], got {tuple(k_cache.shape)}"
    )
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "k_cache and v_cache must be contiguous"
    assert k_cache.dtype == v_cache.dtype == k.dtype, f"cache dtype {k_cache.dtype} != k {k.dtype}"
    assert slots.shape == (k.shape[0],) and slots.dtype in (torch.int32, torch.int64) and slots.is_contiguous()


def rotary_triton(
    positions: torch.Tensor, inv_freq: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
    query_tap: torch.Tensor | None = None, store: KVStore | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """q [T, H, D], k [T, Hkv, D] (last dim contiguous; D/2 a power of two) -> rotated copies.
    query_tap [R, H, D]: also receives the rotated q of the first min(T, R) tokens.
    store (v, k_cache, v_cache, slot_mapping): the rotated k and v also go into the paged caches."""
    check_triton_device(positions, inv_freq, q, k)
    assert q.dim() == 3 and k.dim() == 3 and q.shape[0] == k.shape[0] == positions.shape[0], "q/k [T, H, D], positions [T]"
    head_dim = q.shape[2]
    half = head_dim // 2
    assert k.shape[2] == head_dim and inv_freq.shape == (half,), f"inv_freq {tuple(inv_freq.shape)} != [{half}]"
    assert half & (half - 1) == 0 and q.stride(2) == 1 and k.stride(2) == 1, "D/2 a power of two, last dim contiguous"
    assert inv_freq.is_contiguous() and positions.is_contiguous()
    assert q.dtype == k.dtype, f"q and k dtypes differ: {q.dtype} vs {k.dtype}"
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    tap = q_out if query_tap is None else query_tap
    if query_tap is not None:
        assert query_tap.dim() == 3 and query_tap.shape[1:] == q.shape[1:] and query_tap.dtype == q.dtype, (
            f"query_tap must be [R, {q.shape[1]}, {head_dim}] {q.dtype}, got {tuple(query_tap.shape)} {query_tap.dtype}"
        )
        assert query_tap.stride(2) == 1 and query_tap.device == q.device, "query_tap: last dim contiguous, q's device"
    if store is not None:
        check_store(store, k)
        v, k_cache, v_cache, slots = store
    else:
        v, k_cache, v_cache, slots = k, k_out, k_out, positions  # unused: STORE is off
    if q.shape[0]:
        block_hq = min(triton.next_power_of_2(q.shape[1]), Q_HEADS_PER_PROGRAM)
        _rotary_kernel[(q.shape[0], 1 + triton.cdiv(q.shape[1], block_hq))](
            positions, inv_freq, q, q_out, k, k_out, tap, q.shape[1], k.shape[1],
            q.stride(0), q.stride(1), q_out.stride(0), q_out.stride(1),
            k.stride(0), k.stride(1), k_out.stride(0), k_out.stride(1), tap.stride(0), tap.stride(1),
            v, k_cache, v_cache, slots, v.stride(0), v.stride(1),
            HALF=half, BLOCK_HQ=block_hq, BLOCK_HK=triton.next_power_of_2(k.shape[1]),
            TAP_ROWS=0 if query_tap is None else query_tap.shape[0], STORE=store is not None,
        )  # fmt: skip
    return q_out, k_out
