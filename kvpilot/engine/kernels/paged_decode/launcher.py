"""Launcher for paged decode attention: checks the contract, then launches split kernel + reduction."""

from __future__ import annotations

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.paged_checks import (
    check_block_tables,
    check_int_vector,
    check_paged_cache,
    dot_dtype,
    dot_precision,
    kernel_window,
)
from kvpilot.engine.kernels.paged_decode.heuristics import DecodeConfig, decode_config
from kvpilot.engine.kernels.paged_decode.kernel import (
    LOG2E,
    _paged_decode_kernel,
    _paged_decode_reduce_kernel,
)
from kvpilot.engine.kernels.tickets import ticket_counters


def paged_attention_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    config: DecodeConfig | None = None,
    window: int = 0,
) -> torch.Tensor:
    """q [B, Hq, D]; block_tables int32 [B, max_blocks]; context_lens int32 [B] (0: a padding row, output zeros);
    config overrides the heuristic; window > 0: each query sees its last `window` positions."""
    check_triton_device(q, k_cache, v_cache, block_tables, context_lens)
    block_size, num_kv_heads, group = check_paged_cache(q, k_cache, v_cache)
    batch, num_heads, head_dim = q.shape
    check_int_vector("context_lens", context_lens, batch)
    check_block_tables(block_tables, batch)
    if config is None:
        config = decode_config(batch, num_kv_heads, head_dim, block_tables.shape[1] * block_size, q.device)
    assert config.num_splits >= 1, f"num_splits {config.num_splits}: want >= 1"
    assert config.block_n >= 16 and config.block_n & (config.block_n - 1) == 0, f"block_n {config.block_n}: want a power of two >= 16"
    out = torch.empty_like(q)
    if batch == 0:
        return out
    num_splits = config.num_splits
    partial_o = partial_lse = counter = out
    fold = False
    if num_splits > 1 and config.fold_reduce:
        found = ticket_counters(q.device, batch * num_kv_heads)  # None: more needed inside a capture
        fold = found is not None
        counter = found if found is not None else out
    if num_splits > 1:
        partial_o = torch.empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        partial_lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=q.device)
    operand_dtype = dot_dtype(q.dtype)
    _paged_decode_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, partial_o, partial_lse, counter,
        scale * LOG2E, kernel_window(window),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_HEADS=num_heads, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_N=config.block_n, NUM_SPLITS=num_splits,
        DOT_DTYPE=operand_dtype, DOT_PRECISION=dot_precision(operand_dtype), FOLD=fold,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if num_splits > 1 and not fold:
        _paged_decode_reduce_kernel[(batch, num_heads)](
            partial_o, partial_lse, out, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
        )
    return out
