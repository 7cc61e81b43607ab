"""Launcher for the KV-cache write kernel: checks the contract, then launches one program per token."""

from __future__ import annotations

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.store_kvcache.kernel import _store_kvcache_kernel

TOKENS_PER_PROGRAM = 16


def check_store_contract(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """What a write of key/value [N, Hkv, D] into caches [blocks, block_size, Hkv, D] at slot_mapping [N] needs
    (this kernel's, and the rotary kernel's when it stores: kernels/rotary/launcher.py)."""
    assert key.dim() == 3 and key.shape == value.shape, f"key {tuple(key.shape)} / value {tuple(value.shape)}: want equal [N, Hkv, D]"
    num_tokens, num_kv_heads, head_dim = key.shape
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "k_cache/v_cache: want equal [num_blocks, block_size, Hkv, D]"
    assert tuple(k_cache.shape[2:]) == (num_kv_heads, head_dim), f"cache heads/dim {tuple(k_cache.shape[2:])} != key {(num_kv_heads, head_dim)}"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "k_cache and v_cache must be contiguous"
    assert key.dtype == value.dtype == k_cache.dtype == v_cache.dtype, f"dtypes differ: key {key.dtype}, cache {k_cache.dtype}"
    for name, t in (("key", key), ("value", value)):
        assert t.stride(2) == 1 and t.stride(1) == head_dim, f"{name}: each token's [Hkv, D] row must be contiguous, strides {t.stride()}"
    assert slot_mapping.shape == (num_tokens,), f"slot_mapping {tuple(slot_mapping.shape)}: want [{num_tokens}]"
    assert slot_mapping.dtype in (torch.int32, torch.int64), f"slot_mapping dtype {slot_mapping.dtype}: want int32"
    assert slot_mapping.is_contiguous(), "slot_mapping must be contiguous"


def store_kvcache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value [N, Hkv, D] (each token's Hkv*D row contiguous) into caches [blocks, block_size, Hkv, D]."""
    check_triton_device(key, value, k_cache, v_cache, slot_mapping)
    check_store_contract(key, value, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    row = num_kv_heads * head_dim
    block_row = triton.next_power_of_2(row)
    block_t = max(1, min(TOKENS_PER_PROGRAM, 8192 // block_row))
    _store_kvcache_kernel[(triton.cdiv(num_tokens, block_t),)](
        key, value, k_cache, v_cache, slot_mapping, num_tokens, key.stride(0), value.stride(0),
        ROW=row, BLOCK_ROW=block_row, BLOCK_T=block_t,
    )
