"""Triton kernel: each program copies BLOCK_T tokens' K and V rows (all KV heads) into their cache slots."""

from __future__ import annotations

import triton.language as tl

from kvpilot.engine.kernels.interpreter_compat import patch_interpreter
from kvpilot.engine.kernels.specialization import step_kernel

patch_interpreter()


@step_kernel
def _store_kvcache_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    num_tokens,
    stride_key_token,
    stride_value_token,
    ROW: tl.constexpr,
    BLOCK_ROW: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_mask = tokens < num_tokens
    slots = tl.load(slot_mapping_ptr + tokens, mask=token_mask, other=-1).to(tl.int64)
    offs = tl.arange(0, BLOCK_ROW)
    mask = ((slots >= 0) & token_mask)[:, None] & (offs < ROW)[None, :]
    tokens = tokens.to(tl.int64)
    key = tl.load(key_ptr + tokens[:, None] * stride_key_token + offs[None, :], mask=mask)
    value = tl.load(value_ptr + tokens[:, None] * stride_value_token + offs[None, :], mask=mask)
    cache_offs = slots[:, None] * ROW + offs[None, :]
    tl.store(k_cache_ptr + cache_offs, key, mask=mask)
    tl.store(v_cache_ptr + cache_offs, value, mask=mask)
