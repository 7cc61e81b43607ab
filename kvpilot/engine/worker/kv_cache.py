"""The paged KV cache: its layout, bytes per block and allocation, for every pool kind.

One home for what the cache holds per token and layer: 16/32-bit K and V, an MLA latent row, or
8-bit K/V with their scales (int8 / fp8, and the 16-bit + int8 pools of `kv_cache_dtype=auto`).
Each paged layer declares its page (`layer_specs`: core/cache_spec.py, from the strategies'
`cache_spec`); `block_bytes` sums the pages to size the pool; `allocate_kv_cache` creates the tensors
for that kind of page, hands each attention layer its slice, and returns a `KVCache` the runner holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.config.strategy import AUTO_QUANT_DTYPE, QUANTISED, kv_cache_kind
from kvpilot.engine.core.cache_spec import (
    INT8_SCALE_BYTES,
    FullAttentionSpec,
    KVCacheSpec,
    LatentSpec,
    QuantizedKVSpec,
    block_bytes,
    pool_kind,
)
from kvpilot.engine.kernels.kv_quant.layout import zeros_dim_major, zeros_token_contiguous
from kvpilot.engine.kernels.kv_quant.reference import FP8_DTYPE
from kvpilot.engine.strategies.contract import ConversionReserve, RunnerView
from kvpilot.engine.strategies.kv_quant.layer import LayerKVQuant
from kvpilot.engine.strategies.registry import Strategies
from kvpilot.engine.worker.memory import DTYPES
from kvpilot.strategy_schema import kv_dtype

QUANT_DTYPES = {"int8": torch.int8, "fp8": FP8_DTYPE}


@dataclass(frozen=True)
class KVLayout:
    """What the KV pool holds: `kind` ('model', a 16/32-bit name, 'int8', 'fp8', 'auto-switch')."""

    kind: str
    dtype16: torch.dtype  # the unquantised pool's dtype
    quant: str | None  # 'int8' | 'fp8' for the 8-bit pool, None without one
    split: float = 0.5  # auto-switch: share of the KV memory for the 16-bit pool; int8/fp8: the 16-bit
    # fallback reserve's share (0: none), core/reserve.py

    @property
    def dtype(self) -> torch.dtype:
        """The cache dtype of a single-pool layout (the 16-bit one under auto switching)."""
        if self.kind in QUANTISED:
            return QUANT_DTYPES[self.kind]
        return self.dtype16

    @property
    def is_quantised(self) -> bool:
        return self.quant is not None

    def bytes16(self, mc: ModelConfig, block_size: int) -> int:
        elem = torch.empty((), dtype=self.dtype16).element_size()
        return 2 * num_kv_layers(mc) * block_size * mc.num_key_value_heads * mc.head_dim * elem

    def bytes8(self, mc: ModelConfig, block_size: int) -> int:
        """One 8-bit block, all layers, K and V, with int8's per-token scales (fp8's are per layer)."""
        per_token = mc.head_dim + (INT8_SCALE_BYTES if kv_dtype(self.quant).token_scales else 0)
        return 2 * num_kv_layers(mc) * block_size * mc.num_key_value_heads * per_token

    def split_blocks(self, num_blocks: int, mc: ModelConfig, block_size: int) -> tuple[int, int]:
        """(16-bit blocks, 8-bit blocks) for a pool of num_blocks blocks of bytes_per_block each."""
        if self.kind in QUANTISED:  # num_blocks counts 8-bit blocks; the reserve takes a share of their bytes
            if self.split <= 0.0:
                return 0, num_blocks
            if num_blocks < 2:
                raise ValueError(f"an 8-bit cache with a fallback reserve needs >= 2 KV blocks, got {num_blocks}")
            n8 = max(1, num_blocks - max(1, round(num_blocks * self.split)))
            n16 = max(1, (num_blocks - n8) * self.bytes8(mc, block_size) // self.bytes16(mc, block_size))
            return n16, n8
        if self.kind != "auto-switch":
            return num_blocks, 0
        if num_blocks < 2:
            raise ValueError(f"kv_cache_dtype=auto switching needs >= 2 KV blocks (one per pool), got {num_blocks}")
        n16 = min(num_blocks - 1, max(1, int(num_blocks * self.split)))
        n8 = (num_blocks - n16) * self.bytes16(mc, block_size) // self.bytes8(mc, block_size)
        return n16, n8


def kv_layout_for(config: EngineConfig, compute_dtype: torch.dtype) -> KVLayout:
    """The layout the config asks for, given the model's compute dtype."""
    kind = kv_cache_kind(config)
    if kind in ("model", "auto-switch") or kind in QUANTISED:
        dtype16 = compute_dtype
    else:
        dtype16 = DTYPES[kind]
    quant = kind if kind in QUANTISED else AUTO_QUANT_DTYPE if kind == "auto-switch" else None
    split = config.fallback_reserve if kind in QUANTISED else config.kv_quant_auto_split
    return KVLayout(kind, dtype16, quant, split)


def num_kv_layers(mc: ModelConfig) -> int:
    """Layers with a paged K/V cache: all but a hybrid model's linear-attention layers, whose
    recurrent state lives in the state pool (worker/state_cache.py), sized per sequence instead."""
    return mc.num_hidden_layers - (mc.hybrid.num_linear_layers if mc.hybrid is not None else 0)


def layer_specs(layout: KVLayout, mc: ModelConfig, strategies: Strategies, runner: RunnerView) -> list[KVCacheSpec]:
    """Each paged layer's cache spec: 16/32-bit K/V of `mc`'s KV heads, as the strategies change it
    (8-bit K/V, an MLA latent row). A hybrid model's linear-attention layers have none."""
    base = FullAttentionSpec(mc.num_key_value_heads, mc.head_dim, layout.dtype16.itemsize)
    return [strategies.cache_spec(base, runner)] * num_kv_layers(mc)


@dataclass
class KVCache:
    """The allocated pool: `kv_cache` (16/32-bit K/V or latent), the 8-bit K/V and scales when quantised,
    the usable block count and the pool sizes ((16-bit, int8) under auto switching)."""

    kv_cache: torch.Tensor
    num_blocks: int
    pool_sizes: tuple[int, ...]
    kv_cache8: tuple[torch.Tensor, torch.Tensor] | None = None
    kv_scales: torch.Tensor | None = None
    reserve_cache: torch.Tensor | None = None  # a conversion's K/V fallback reserve (MLA, GQA)
    exact_block_bytes: int = 0  # bytes of one reserve block (0: no conversion reserve)

    @property
    def quant_bytes(self) -> int:
        """Bytes beside `kv_cache`: the 8-bit K/V and scales, or the MLA conversion's K/V reserve (0: none)."""
        extra = [] if self.reserve_cache is None else [self.reserve_cache]
        if self.kv_cache8 is not None and self.kv_scales is not None:
            extra += [*self.kv_cache8, self.kv_scales]
        return sum(t.numel() * t.element_size() for t in extra)


def reserve_blocks(num_blocks: int, share: float, converted_bytes: int, exact_bytes: int) -> tuple[int, int]:
    """(exact reserve blocks, converted blocks) for a pool of num_blocks converted blocks: `share` of its
    bytes held as K/V blocks of the unconverted layers (a conversion's fallback reserve)."""
    if share <= 0.0:
        return 0, num_blocks
    if num_blocks < 2:
        raise ValueError(f"a conversion with a fallback reserve needs >= 2 KV blocks, got {num_blocks}")
    n_converted = max(1, num_blocks - max(1, round(num_blocks * share)))
    return max(1, (num_blocks - n_converted) * converted_bytes // exact_bytes), n_converted


def allocate_kv_cache(
    layout: KVLayout, model: nn.Module, mc: ModelConfig, specs: list[KVCacheSpec], num_blocks: int,
    block_size: int, device: torch.device, reserve: ConversionReserve | None = None,
) -> KVCache:
    """Allocate the pool for `num_blocks` blocks of `block_bytes(specs)` each and wire every attention
    layer, by the kind of page the layers declare: 8-bit K/V, an MLA latent row, or 16/32-bit K/V.
    `reserve`: a conversion's share of K/V reserve blocks (layers/reserve_attention.py): the MLA
    conversion's, or the GQA conversion's with the checkpoint's KV heads."""
    layers = model.attention_layers()  # type: ignore[operator]
    kind = pool_kind(specs)
    share = reserve.share if reserve is not None else 0.0
    if kind is QuantizedKVSpec:  # int8 / fp8 / auto switching: 8-bit K/V and scales per layer
        return _allocate_quantised(layout, layers, mc, num_blocks, block_size, device)
    if kind is LatentSpec:  # MLA: one latent row per token and layer (layers/latent_attention.py)
        latent = specs[0]
        assert isinstance(latent, LatentSpec)
        exact_bytes = layout.bytes16(mc, block_size)
        n_exact, n_latent = reserve_blocks(num_blocks, share, block_bytes(specs, block_size), exact_bytes)
        cache = torch.zeros((len(layers), n_latent, block_size, latent.width), dtype=layout.dtype, device=device)
        reserve_kv = torch.zeros((2, len(layers), n_exact, block_size, mc.num_key_value_heads, mc.head_dim),
                                 dtype=layout.dtype, device=device) if n_exact else None  # fmt: skip
        for i, attn in enumerate(layers):
            attn.kv_cache = cache[i]
            if reserve_kv is not None:  # the MLA conversion's fallback reserve (layers/reserve_attention.py)
                attn.reserve_k, attn.reserve_v, attn.first_latent = reserve_kv[0, i], reserve_kv[1, i], n_exact
        sizes = (n_exact, n_latent) if n_exact else (n_latent,)
        return KVCache(cache, n_exact + n_latent, sizes, reserve_cache=reserve_kv, exact_block_bytes=exact_bytes)
    n_exact, n_merged, exact_bytes = 0, num_blocks, 0
    reserve_kv_heads = reserve.kv_heads if reserve is not None else 0
    if reserve_kv_heads:  # the GQA conversion's fallback reserve: K/V blocks of the checkpoint's own heads
        exact_bytes = layout.bytes16(mc, block_size) * reserve_kv_heads // mc.num_key_value_heads
        n_exact, n_merged = reserve_blocks(num_blocks, share, layout.bytes16(mc, block_size), exact_bytes)
    shape = (2, len(layers), n_merged, block_size, mc.num_key_value_heads, mc.head_dim)
    cache = torch.zeros(shape, dtype=layout.dtype, device=device)
    reserve_kv = torch.zeros((2, len(layers), n_exact, block_size, reserve_kv_heads, mc.head_dim),
                             dtype=layout.dtype, device=device) if n_exact else None  # fmt: skip
    for i, attn in enumerate(layers):
        attn.k_cache = cache[0, i]
        attn.v_cache = cache[1, i]
        if reserve_kv is not None:  # strategies/gqa/reserve.py
            attn.reserve_k, attn.reserve_v, attn.first_latent = reserve_kv[0, i], reserve_kv[1, i], n_exact
    sizes = (n_exact, n_merged) if n_exact else (n_merged,)
    return KVCache(cache, n_exact + n_merged, sizes, reserve_cache=reserve_kv, exact_block_bytes=exact_bytes)


def _allocate_quantised(
    layout: KVLayout, layers: list[nn.Module], mc: ModelConfig, num_blocks: int, block_size: int,
    device: torch.device,
) -> KVCache:
    """The 16-bit pool (possibly empty) and the 8-bit pool with scales; each layer gets a LayerKVQuant.
    (An MLA latent cache with 8-bit K/V is refused by config/strategy.py before this runs.)"""
    bs = block_size
    n16, n8 = layout.split_blocks(num_blocks, mc, bs)
    heads, dim = mc.num_key_value_heads, mc.head_dim
    kv_cache = torch.zeros((2, len(layers), n16, bs, heads, dim), dtype=layout.dtype16, device=device)
    # K token-major, V dim-major within a block, int8 scales token-contiguous: kernels/kv_quant/layout.py
    dtype8 = QUANT_DTYPES[layout.quant]
    kv_cache8 = (
        torch.zeros((len(layers), n8, bs, heads, dim), dtype=dtype8, device=device),
        zeros_dim_major((len(layers),), n8, bs, heads, dim, dtype8, device),
    )
    if layout.quant == "int8":
        kv_scales = zeros_token_contiguous((2, len(layers)), n8, bs, heads, torch.float32, device)
    else:
        kv_scales = torch.ones((2, len(layers), heads), dtype=torch.float32, device=device)
    for i, attn in enumerate(layers):
        attn.k_cache, attn.v_cache = kv_cache[0, i], kv_cache[1, i]
        attn.kv_quant = LayerKVQuant(
            layout.quant, kv_cache8[0][i], kv_cache8[1][i], kv_scales[0, i], kv_scales[1, i], n16, bs,
        )
    sizes = (n16, n8) if n16 else (n8,)
    return KVCache(kv_cache, n16 + n8, sizes, kv_cache8, kv_scales)
