"""The 16-bit and 8-bit pools of the KV cache (`kv_cache_dtype=auto` switching, or int8/fp8 with a
16-bit fallback reserve) in the stats feed. Torch-free.

The two-pool block manager is core/pools.PooledBlockManager; core/reserve.py builds
the engine's block manager. `kv_feed` returns the KV dtype, sequences per dtype and pool bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpilot.engine.core.pools import POOL8, POOL16, BlockManagerLike, PooledBlockManager
from kvpilot.engine.strategies.contract import RunnerView

__all__ = ["POOL8", "POOL16", "KVFeed", "PooledBlockManager", "dtype_name", "kv_feed"]
_FEED_DTYPE = {"float8_e4m3fn": "fp8"}


def dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    return _FEED_DTYPE.get(name, name)


@dataclass(frozen=True)
class KVFeed:
    """The KV cache's part of the stats feed: the dtype new sequences get now, running sequences per
    cache dtype, and pool / used bytes (summed over pools of different block bytes)."""

    kv_cache_dtype: str
    sequences_by_dtype: dict[str, int]
    pool_bytes: int
    used_bytes: int


def kv_feed(runner: RunnerView, block_manager: BlockManagerLike, running: int) -> KVFeed:
    """The KV section for the feed, from the runner's layout and the block manager (one pool, a 16-bit
    and an 8-bit pool, or one pool partitioned into a fallback reserve and the rest)."""
    layout = runner.kv_layout
    mc, bs = runner.kv_model_config, runner.block_size  # under TP: every rank's KV heads
    if isinstance(block_manager, PooledBlockManager) and layout.is_quantised:
        names = {POOL16: dtype_name(layout.dtype16), POOL8: layout.quant}
        sizes = {POOL16: layout.bytes16(mc, bs), POOL8: layout.bytes8(mc, bs)}
        pools = block_manager.pools
        counts = block_manager.sequences_per_pool()
        return KVFeed(
            names[block_manager.mode],
            {names[p]: counts[p] for p in pools},
            sum(pools[p].num_blocks * sizes[p] for p in pools),
            sum(pools[p].num_used_blocks * sizes[p] for p in pools),
        )
    name = dtype_name(layout.dtype)
    per_block = runner.bytes_per_block
    if isinstance(block_manager, PooledBlockManager):  # a fallback reserve: unconverted K/V blocks (MLA, GQA)
        exact = runner.cache.exact_block_bytes or per_block  # a conversion's K/V reserve, or the same blocks
        sizes = {POOL16: exact, POOL8: per_block}
        pools = block_manager.pools
        return KVFeed(
            name, {name: running}, sum(pools[p].num_blocks * sizes[p] for p in pools),
            sum(pools[p].num_used_blocks * sizes[p] for p in pools),
        )
    return KVFeed(name, {name: running}, runner.num_kv_blocks * per_block, block_manager.num_used_blocks * per_block)
