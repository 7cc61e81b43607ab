"""`kv_cache_dtype=auto` switching: a 16-bit and an 8-bit block pool, chosen per new sequence. Torch-free.

Design (the simplest correct one): two ordinary BlockManagers share one block-id space, the 16-bit
pool holding ids [0, n16) and the int8 pool ids [n16, n16 + n8); the runner keeps one cache tensor
per pool and tells a token's pool from its slot. A sequence is bound to one pool from its first
allocation until it holds no blocks (finished, aborted or preempted); a preempted sequence is new
again when it is re-admitted. Each pool has its own prefix cache (a block's bytes differ by dtype).

The choice for a new sequence depends on the running batch size n (sequences holding blocks):
8-bit once n >= threshold, back to 16-bit once n < threshold - hysteresis (hysteresis keeps a
batch that hovers at the threshold from flipping every admission).

The Scheduler sees the BlockManager interface; its preemption picks victims without regard to
pools, so freeing a victim in the other pool does not help and it preempts further (correct, and
only when one pool is exhausted).

`build_block_manager` picks the engine's block manager (one pool, or these two) and
`kv_feed` returns the KV dtype, sequences per dtype and pool bytes for the stats feed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.config.strategy import auto_hysteresis
from kvpilot.engine.core.block_manager import BlockManager
from kvpilot.engine.core.sequence import Sequence

POOL16, POOL8 = "16", "8"
_FEED_DTYPE = {"float8_e4m3fn": "fp8"}


class PooledBlockManager:
    """BlockManager interface over a 16-bit pool and an 8-bit pool; new sequences pick by batch size."""

    def __init__(
        self,
        num_blocks16: int,
        num_blocks8: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        threshold: int = 32,
        hysteresis: int = 8,
    ) -> None:
        if threshold < 1 or hysteresis < 0:
            raise ValueError(f"threshold must be >= 1 and hysteresis >= 0, got {threshold}, {hysteresis}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.threshold = threshold
        self.hysteresis = hysteresis
        self.pools = {
            POOL16: BlockManager(num_blocks16, block_size, enable_prefix_caching),
            POOL8: BlockManager(num_blocks8, block_size, enable_prefix_caching, first_block_id=num_blocks16),
        }
        self.mode = POOL16  # the pool new sequences get now
        self.switches_total = 0
        self._bound: dict[str, str] = {}  # request id -> pool, while the sequence holds blocks

    # -- the choice ----------------------------------------------------------------------
    def pool_of(self, seq: Sequence) -> str:
        """seq's pool: its own while it holds blocks, else the one new sequences get now."""
        bound = self._bound.get(seq.request_id)
        if bound is not None:
            return bound
        if seq.exact_path:  # runtime validation moved it off 8-bit KV (strategies/kv_quant/check.py)
            return POOL16
        running = len(self._bound)
        if self.mode == POOL16 and running >= self.threshold:
            self.mode, self.switches_total = POOL8, self.switches_total + 1
        elif self.mode == POOL8 and running < self.threshold - self.hysteresis:
            self.mode, self.switches_total = POOL16, self.switches_total + 1
        return self.mode

    def manager_of(self, seq: Sequence) -> BlockManager:
        return self.pools[self.pool_of(seq)]

    def sequences_per_pool(self) -> dict[str, int]:
        counts = dict.fromkeys(self.pools, 0)
        for pool in self._bound.values():
            counts[pool] += 1
        return counts

    # -- BlockManager interface ----------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return sum(p.num_blocks for p in self.pools.values())

    @property
    def num_free_blocks(self) -> int:
        return sum(p.num_free_blocks for p in self.pools.values())

    @property
    def num_used_blocks(self) -> int:
        return sum(p.num_used_blocks for p in self.pools.values())

    @property
    def num_cached_free_blocks(self) -> int:
        return sum(p.num_cached_free_blocks for p in self.pools.values())

    @property
    def prefix_queried_tokens(self) -> int:
        return sum(p.prefix_queried_tokens for p in self.pools.values())

    @prefix_queried_tokens.setter
    def prefix_queried_tokens(self, value: int) -> None:  # LLMEngine.reset_stats sets 0
        for i, pool in enumerate(self.pools.values()):
            pool.prefix_queried_tokens = value if i == 0 else 0

    @property
    def prefix_hit_tokens(self) -> int:
        return sum(p.prefix_hit_tokens for p in self.pools.values())

    @prefix_hit_tokens.setter
    def prefix_hit_tokens(self, value: int) -> None:
        for i, pool in enumerate(self.pools.values()):
            pool.prefix_hit_tokens = value if i == 0 else 0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, seq: Sequence) -> list[tuple[int, int]]:
        return self.manager_of(seq).match_prefix(seq)

    def can_allocate(
        self,
        seq: Sequence,
        num_new_tokens: int,
        hits: list[tuple[int, int]] | None = None,
        reserve_blocks: int = 0,
    ) -> bool:
        pool = self.manager_of(seq)
        reserve = -(-reserve_blocks * pool.num_blocks // max(1, self.num_blocks))  # the pool's share
        return pool.can_allocate(seq, num_new_tokens, hits, reserve)

    def allocate(self, seq: Sequence, num_new_tokens: int, hits: list[tuple[int, int]] | None = None) -> None:
        name = self.pool_of(seq)
        self.pools[name].allocate(seq, num_new_tokens, hits)
        self._bound[seq.request_id] = name

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        return self.manager_of(seq).can_append(seq, num_new_tokens)

    def may_append(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        name = self.pool_of(seq)
        self.pools[name].may_append(seq, num_new_tokens)
        if seq.block_table:  # a sequence that never allocate()d (paged scoring) is bound by its first blocks
            self._bound.setdefault(seq.request_id, name)

    def commit(self, seq: Sequence) -> None:
        self.manager_of(seq).commit(seq)

    def deallocate(self, seq: Sequence) -> None:
        name = self._bound.pop(seq.request_id, None)
        if name is None and seq.block_table:
            raise AssertionError(f"{seq.request_id} holds blocks {seq.block_table} but is bound to no pool")
        self.pools[name or POOL16].deallocate(seq)  # with no blocks this only resets seq's counters


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


@dataclass(frozen=True)
class KVFeed:
    """The KV cache's part of the stats feed: the dtype new sequences get now, running sequences per
    cache dtype, and pool / used bytes (summed over pools of different block bytes)."""

    kv_cache_dtype: str
    sequences_by_dtype: dict[str, int]
    pool_bytes: int
    used_bytes: int


def kv_feed(runner: Any, block_manager: Any, running: int) -> KVFeed:
    """The KV section for the feed, from the runner's layout and the block manager (one pool or two)."""
    layout = runner.kv_layout
    mc, bs = runner.model_config, runner.block_size
    if isinstance(block_manager, PooledBlockManager):
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
    return KVFeed(name, {name: running}, runner.num_kv_blocks * per_block, block_manager.num_used_blocks * per_block)
