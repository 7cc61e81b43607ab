"""The KV pool split the engine makes: a fallback reserve beside a lossy strategy's pool, or the 16-bit
and int8 pools of `kv_cache_dtype: auto` switching (engine: strategies/fallback, core/pools.py).

- A lossy strategy (int8/fp8 KV, GQA or MLA conversion, Performer, eviction) keeps `fallback_reserve` of the KV pool
  as exact-path blocks (16-bit K/V of the unconverted layers) for sequences that fail runtime
  validation: the approximate pool is the rest, and the concurrency limit is planned on it.
- `auto` with `kv_quant_auto_threshold` T: `kv_quant_auto_split` of the pool holds 16-bit blocks, the
  rest int8; new sequences take int8 once T run. The 16-bit pool must hold T sequences, or the
  switch never happens (the batch stalls below T with the 16-bit pool full).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvpilot.planner.model_shape import ModelShape
from kvpilot.planner.strategy import KVStrategy, kv_footprint, rope_dims
from kvpilot.strategy_schema import EIGHT_BIT_KV_DTYPES


@dataclass(frozen=True)
class PoolSplit:
    """How the KV pool's bytes divide, and how many max_seq_len sequences each part holds."""

    reserve_bytes: int = 0  # exact-path fallback reserve (0: none)
    reserve_sequences: int = 0
    pool16_sequences: int = 0  # auto switching: sequences each pool holds (0 otherwise)
    pool8_sequences: int = 0


def is_lossy(model: ModelShape, strategy: KVStrategy) -> bool:
    """Whether the engine serves this strategy approximately with an exact path to fall back to."""
    converted_mla = strategy.attention == "mla" and model.mla is None
    merged = strategy.attention == "gqa" and (strategy.kv_head_groups or 0) < model.num_kv_heads
    return (strategy.kv_cache_dtype in EIGHT_BIT_KV_DTYPES or converted_mla or merged or strategy.attention == "linear"
            or strategy.eviction != "none")


def exact_sequence_bytes(model: ModelShape, strategy: KVStrategy, max_seq_len: int) -> int:
    """One max_seq_len sequence on the exact path: K/V of the unconverted layers in the model's dtype."""
    exact = KVStrategy(kv_cache_dtype="auto", block_size=strategy.block_size)  # unevicted, too
    return kv_footprint(model, exact).sequence_bytes(max_seq_len, strategy.block_size)


def split_pool(model: ModelShape, strategy: KVStrategy, pool_bytes: int, max_seq_len: int) -> PoolSplit:
    """The reserve (lossy strategies) or the two auto-switching pools of a KV pool of pool_bytes."""
    exact = exact_sequence_bytes(model, strategy, max_seq_len)
    if strategy.kv_cache_dtype == "auto" and strategy.kv_quant_auto_threshold is not None:
        pool16 = int(pool_bytes * strategy.kv_quant_auto_split)
        int8 = replace(strategy, kv_cache_dtype="int8", kv_quant_auto_threshold=None)
        per8 = kv_footprint(model, int8).sequence_bytes(max_seq_len, strategy.block_size)
        return PoolSplit(pool16_sequences=pool16 // exact, pool8_sequences=(pool_bytes - pool16) // per8)
    if strategy.fallback_reserve > 0 and is_lossy(model, strategy):
        reserve = int(pool_bytes * strategy.fallback_reserve)
        return PoolSplit(reserve_bytes=reserve, reserve_sequences=reserve // exact)
    return PoolSplit()


def extra_weight_bytes(model: ModelShape, strategy: KVStrategy) -> int:
    """Bytes the engine holds beyond the checkpoint's weights for a conversion, or saves by it:
    GQA merges K/V (fewer) and keeps the originals of the validated layer (runtime validation) or, with
    a fallback reserve, of every layer (the unmerged path), plus every layer's original o_proj when
    calibrated (strategies/gqa/compensate.py rewrites it); the MLA conversion keeps every layer's K/V
    projections (validation, fallback) beside its factors, counted at the cached row's width (latent
    plus partial RoPE's exact key dims, as the engine plans it: server/runtime/capacity_plan.py cached_latent_width)."""
    width = model.weight_dtype_bytes or model.dtype_bytes
    h, kv = model.hidden_size, model.num_kv_heads * model.head_dim
    layers = model.num_full_layers
    if strategy.attention == "gqa" and model.mla is None and strategy.kv_head_groups:
        merged = strategy.kv_head_groups * model.head_dim
        if merged >= kv:
            return 0
        kept = layers if strategy.fallback_reserve > 0 else 1
        # calibrated: value compensation rewrote o_proj, so the reserve's heads need the original one
        o_proj = layers * h * model.num_attention_heads * model.head_dim if strategy.calibrated and kept > 1 else 0
        return (layers * 2 * h * (merged - kv) + kept * 2 * h * kv + o_proj) * width
    if strategy.attention == "mla" and model.mla is None and strategy.latent_rank:
        r = strategy.latent_rank + model.num_kv_heads * rope_dims(model, strategy)
        return layers * (r * h + 2 * kv * r) * width
    return 0
