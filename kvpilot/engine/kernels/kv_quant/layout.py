"""Memory layouts of the 8-bit KV caches: which way each tensor is laid out, and how to allocate it.

Every cache keeps the logical shape `[num_blocks, block_size, Hkv, D]` (scale caches
`[num_blocks, block_size, Hkv]`), so torch code indexes it as before; only the strides change.

- K: token-major, `[block][token][head][dim]` (contiguous). The int8 x int8 score MMA reads K as its
  B operand with the reduction (dim) axis contiguous, which this layout already is.
- V (8-bit): **dim-major within a block**, storage `[block][head][dim][token]`. The P x V product
  reduces over tokens, so its B operand wants tokens contiguous. With token-major 8-bit V the kernel
  had to transpose every tile byte by byte through shared memory (128 LDS.U8 + 64 PRMT per warp per
  128-token tile, a third of the loop: docs/benchmarks.md "8-bit decode"); 16-bit V has
  ldmatrix.trans for this, 8-bit has none.
- int8 scales: **token-contiguous within a block**, storage `[block][head][token]`: one tile's
  scales for a KV head are 4 x block_size contiguous bytes instead of one 32-byte sector per token.

The kernels take strides and accept the contiguous layouts too (tests use both).
"""

from __future__ import annotations

import torch


def zeros_dim_major(lead: tuple[int, ...], num_blocks: int, block_size: int, heads: int, dim: int,
                    dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Zeros of logical shape lead + [num_blocks, block_size, heads, dim], stored [.., block, head, dim, token]."""
    storage = torch.zeros((*lead, num_blocks, heads, dim, block_size), dtype=dtype, device=device)
    n = len(lead)
    return storage.permute(*range(n), n, n + 3, n + 1, n + 2)


def zeros_token_contiguous(lead: tuple[int, ...], num_blocks: int, block_size: int, heads: int,
                           dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Zeros of logical shape lead + [num_blocks, block_size, heads], stored [.., block, head, token]."""
    storage = torch.zeros((*lead, num_blocks, heads, block_size), dtype=dtype, device=device)
    n = len(lead)
    return storage.permute(*range(n), n, n + 2, n + 1)


def is_dim_major(v: torch.Tensor) -> bool:
    """v [num_blocks, block_size, Hkv, D] stored [block][head][dim][token] (densely)."""
    _, page, heads, dim = v.shape
    return v.stride()[1:] == (1, dim * page, page) and v.stride(0) == heads * dim * page


def is_token_contiguous(scale: torch.Tensor) -> bool:
    """A scale cache [num_blocks, block_size, Hkv] stored [block][head][token] (densely)."""
    _, page, heads = scale.shape
    return scale.stride() == (heads * page, 1, page)


def check_cache_layout(cache: torch.Tensor, name: str) -> None:
    """Contiguous or dim-major; anything else (a slice, a transpose) is refused with the layouts allowed."""
    assert cache.dim() == 4, f"{name} must be [num_blocks, block_size, Hkv, D], got {tuple(cache.shape)}"
    assert cache.is_contiguous() or is_dim_major(cache), (
        f"{name} strides {cache.stride()} for shape {tuple(cache.shape)}: want contiguous or dim-major "
        "(kv_quant.layout.zeros_dim_major)"
    )


def check_scale_layout(scale: torch.Tensor, name: str) -> None:
    assert scale.is_contiguous() or is_token_contiguous(scale), (
        f"{name} strides {scale.stride()} for shape {tuple(scale.shape)}: want contiguous or token-contiguous "
        "(kv_quant.layout.zeros_token_contiguous)"
    )
