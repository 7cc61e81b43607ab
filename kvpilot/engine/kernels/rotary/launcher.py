"""Launcher for the RoPE kernel: checks the contract, then one launch: per token one program for k, one per 8 q heads."""

from __future__ import annotations

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.rotary.kernel import _rotary_kernel
from kvpilot.engine.kernels.store_kvcache.launcher import check_store_contract

Q_HEADS_PER_PROGRAM = 8  # query heads a program rotates; k (and the store) take one more program per token
KVStore = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # v [T, Hkv, D], k/v caches, slots [T]


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
        v, k_cache, v_cache, slots = store
        check_triton_device(v, k_cache, v_cache, slots)
        check_store_contract(k, v, k_cache, v_cache, slots)  # store_kvcache's: the same write
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
