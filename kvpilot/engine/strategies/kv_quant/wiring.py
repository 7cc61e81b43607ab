"""LLMEngine's side of the KV strategies: its block manager and the KV fields of the stats feed."""

from __future__ import annotations

from typing import Any

from kvpilot.engine.block_manager import BlockManager
from kvpilot.engine.config import EngineConfig
from kvpilot.engine.kv_pools import POOL8, POOL16, PooledBlockManager
from kvpilot.engine.kv_strategy import auto_hysteresis

_FEED_DTYPE = {"float8_e4m3fn": "fp8"}


def build_block_manager(
    config: EngineConfig, runner: Any, enable_prefix_caching: bool
) -> BlockManager | PooledBlockManager:
    """One BlockManager over the pool, or a PooledBlockManager under kv_cache_dtype=auto switching."""
    if runner.kv_layout.kind != "auto-switch":
        return BlockManager(runner.num_kv_blocks, config.block_size, enable_prefix_caching)
    n16, n8 = runner.kv_pool_sizes
    return PooledBlockManager(
        n16, n8, config.block_size, enable_prefix_caching,
        threshold=config.kv_quant_auto_threshold or 1, hysteresis=auto_hysteresis(config),
    )


def dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    return _FEED_DTYPE.get(name, name)


def apply_kv_stats(feed: dict[str, Any], runner: Any, block_manager: Any) -> dict[str, Any]:
    """engine.kv_cache_dtype = the dtype new sequences get now; kv.sequences_by_dtype = running
    sequences per cache dtype; memory_bytes.kv_pool / kv_used summed over pools of different bytes."""
    layout = runner.kv_layout
    mc, bs = runner.model_config, runner.block_size
    running = feed["requests"]["running"]
    if isinstance(block_manager, PooledBlockManager):
        names = {POOL16: dtype_name(layout.dtype16), POOL8: layout.quant}
        sizes = {POOL16: layout.bytes16(mc, bs), POOL8: layout.bytes8(mc, bs)}
        pools = block_manager.pools
        feed["engine"]["kv_cache_dtype"] = names[block_manager.mode]
        counts = block_manager.sequences_per_pool()
        feed["kv"]["sequences_by_dtype"] = {names[p]: counts[p] for p in pools}
        feed["memory_bytes"]["kv_pool"] = sum(pools[p].num_blocks * sizes[p] for p in pools)
        feed["memory_bytes"]["kv_used"] = sum(pools[p].num_used_blocks * sizes[p] for p in pools)
    else:
        name = dtype_name(layout.dtype)
        feed["engine"]["kv_cache_dtype"] = name
        feed["kv"]["sequences_by_dtype"] = {name: running}
    return feed
