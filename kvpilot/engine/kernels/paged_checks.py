"""Contract checks shared by the paged attention launchers (shapes, dtypes, strides, devices)."""

from __future__ import annotations

import os

import torch
import triton.language as tl

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_paged_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int]:
    """Return (block_size, num_kv_heads, group) after checking q [*, Hq, D] against the caches."""
    assert q.dim() == 3, f"q has shape {tuple(q.shape)}: want [tokens, Hq, D]"
    assert q.stride(2) == 1, f"q must be contiguous in head_dim, strides {q.stride()}"
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape, (
        f"k_cache {tuple(k_cache.shape)} / v_cache {tuple(v_cache.shape)}: want equal [num_blocks, block_size, Hkv, D]"
    )
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "k_cache and v_cache must be contiguous"
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    num_heads = q.shape[1]
    assert q.shape[2] == head_dim, f"q head_dim {q.shape[2]} != cache head_dim {head_dim}"
    assert head_dim in (16, 32, 64, 128, 256), f"head_dim {head_dim}: supported are 16, 32, 64, 128, 256"
    assert block_size >= 8 and block_size & (block_size - 1) == 0, (
        f"block_size {block_size}: must be a power of two >= 8"
    )
    assert num_heads % num_kv_heads == 0, f"Hq={num_heads} must be a multiple of Hkv={num_kv_heads}"
    assert q.dtype in SUPPORTED_DTYPES, f"dtype {q.dtype}: supported are {SUPPORTED_DTYPES}"
    assert q.dtype == k_cache.dtype == v_cache.dtype, f"q {q.dtype} and caches {k_cache.dtype} must share a dtype"
    return block_size, num_kv_heads, num_heads // num_kv_heads


def check_int_vector(name: str, t: torch.Tensor, length: int) -> None:
    assert t.shape == (length,), f"{name} has shape {tuple(t.shape)}: want [{length}]"
    assert t.dtype == torch.int32, f"{name} dtype {t.dtype}: want torch.int32"
    assert t.is_contiguous(), f"{name} must be contiguous"


NO_WINDOW = 1 << 30  # the kernels' window when attention sees the whole context (longer than any context)


def kernel_window(window: int) -> int:
    """The window a paged attention kernel takes: `window` keys (sliding-window attention), 0 for all."""
    if not 0 <= window < NO_WINDOW:
        raise ValueError(f"sliding window must be 0 (none) or a token count below {NO_WINDOW}, got {window}")
    return window or NO_WINDOW


def check_block_tables(block_tables: torch.Tensor, batch: int) -> None:
    assert block_tables.dim() == 2 and block_tables.shape[0] == batch, (
        f"block_tables has shape {tuple(block_tables.shape)}: want [{batch}, max_blocks]"
    )
    assert block_tables.dtype == torch.int32, f"block_tables dtype {block_tables.dtype}: want torch.int32"
    assert block_tables.stride(1) == 1, f"block_tables rows must be contiguous, strides {block_tables.stride()}"


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand dtype for tl.dot: the input dtype, except bf16 under Triton 3.6's interpreter, whose
    bf16 tl.dot returns garbage; there the operands are upcast to fp32 (compiled kernels never are)."""
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        return tl.float32
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[dtype]


def dot_precision(operand_dtype: tl.dtype) -> str:
    """fp32 operands keep full precision in tl.dot (no TF32), so fp32 runs match the reference closely."""
    return "ieee" if operand_dtype == tl.float32 else "tf32"
