"""What one paged layer caches per block (vLLM v1's KVCacheSpec): a memory strategy's per-layer cache spec.

Torch-free. The runner starts every paged layer at `FullAttentionSpec` (16/32-bit K and V) and lets
each active strategy replace it (strategies/registry.py): 8-bit K/V with scales, or an MLA latent
row. A block's bytes over all layers are the sum of the layers' pages, so the pool is sized and
allocated without asking the strategies again.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.strategy_schema import KV_SCALE_BYTES

INT8_SCALE_BYTES = KV_SCALE_BYTES  # an int8 page's fp32 scale per token and KV head, for K and V (fp8's: per layer)


@dataclass(frozen=True)
class FullAttentionSpec:
    """K and V of `num_kv_heads` heads of `head_dim`, `dtype_bytes` per element."""

    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    def page_size_bytes(self, block_size: int) -> int:
        return 2 * block_size * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class QuantizedKVSpec:
    """8-bit K and V (`quant` int8 / fp8; int8 adds an fp32 scale per token and head, for K and for V),
    beside a 16-bit pool of `full` pages. `sized_by_full`: the 16-bit page sizes the pool (auto
    switching, whose 16-bit and int8 pools split the memory); else the 8-bit page does."""

    full: FullAttentionSpec
    quant: str
    scale_bytes: int
    sized_by_full: bool = False

    def quant_page_bytes(self, block_size: int) -> int:
        return 2 * block_size * self.full.num_kv_heads * (self.full.head_dim + self.scale_bytes)

    def page_size_bytes(self, block_size: int) -> int:
        if self.sized_by_full:
            return self.full.page_size_bytes(block_size)
        return self.quant_page_bytes(block_size)


@dataclass(frozen=True)
class LatentSpec:
    """One MLA latent row of `width` per token, `dtype_bytes` per element (K and V rebuilt from it)."""

    width: int
    dtype_bytes: int

    def page_size_bytes(self, block_size: int) -> int:
        return block_size * self.width * self.dtype_bytes


KVCacheSpec = FullAttentionSpec | QuantizedKVSpec | LatentSpec


def block_bytes(specs: list[KVCacheSpec], block_size: int) -> int:
    """Bytes of one block over all paged layers: the unit that sizes the pool."""
    return sum(spec.page_size_bytes(block_size) for spec in specs)


def pool_kind(specs: list[KVCacheSpec]) -> type:
    """The one spec type of the paged layers (a pool holds one kind of page); ValueError when mixed."""
    kinds = {type(spec) for spec in specs}
    if len(kinds) != 1:
        raise ValueError(f"the paged layers declare {sorted(k.__name__ for k in kinds)}: one pool holds one kind")
    return kinds.pop()
