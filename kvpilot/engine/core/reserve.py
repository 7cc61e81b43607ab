"""The exact-path reserve every lossy strategy falls back to, and the engine's block manager (torch-free).

A lossy strategy serves new sequences from its approximate pool (8-bit K/V, an evicting or
Performer view, an MLA latent). `fallback_reserve` (a share of the KV memory, sized by the
capacity planner, kvpilot/planner) is kept as an exact pool: 16-bit K/V for int8/fp8, full-context
blocks for eviction and Performer, unconverted K/V for the MLA conversion. A sequence that fails
runtime validation is flagged `exact_path`, its approximate blocks are freed and it is recomputed
from token 0 in the exact pool (core/pools.PooledBlockManager binds it there). When the reserve is
full it waits at the head of the queue (preempted) until exact blocks free: it is never served
degraded. A sequence too long for the whole reserve cannot fall back: the check warns and counts it.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.config.strategy import auto_hysteresis
from kvpilot.engine.core.block_manager import BlockManager
from kvpilot.engine.core.pools import EXACT, PooledBlockManager
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.metrics.stats_contract import IDLE_RESERVE, ReserveSection


def partition_reserve(num_blocks: int, share: float) -> tuple[int, int]:
    """(exact, approximate) blocks when both pools hold blocks of one size: `share` of them exact."""
    if share <= 0.0:
        return 0, num_blocks
    if num_blocks < 2:
        raise ValueError(f"a fallback reserve needs >= 2 KV blocks (one per pool), got {num_blocks}")
    exact = min(num_blocks - 1, max(1, round(num_blocks * share)))
    return exact, num_blocks - exact


def build_block_manager(
    config: EngineConfig, pool_sizes: tuple[int, ...], switching: bool, shares_blocks: bool, enable_prefix_caching: bool
) -> BlockManager | PooledBlockManager:
    """One BlockManager over the pool, or a PooledBlockManager: two pools the runner allocated
    (`pool_sizes` (exact, approximate): auto `switching`, int8/fp8 with a 16-bit reserve, MLA latent +
    K/V reserve), or one pool of blocks partitioned into a reserve and the rest when a strategy keeps
    its exact path over the same blocks (`shares_blocks`: eviction, Performer)."""
    bs = config.block_size
    if len(pool_sizes) == 2:
        n_exact, n_approx = pool_sizes
        return PooledBlockManager(
            n_exact, n_approx, bs, enable_prefix_caching,
            threshold=(config.kv_quant_auto_threshold or 1) if switching else None,
            hysteresis=auto_hysteresis(config) if switching else 0,
        )  # fmt: skip
    if shares_blocks and config.fallback_reserve > 0:
        n_exact, n_approx = partition_reserve(pool_sizes[0], config.fallback_reserve)
        return PooledBlockManager(n_exact, n_approx, bs, enable_prefix_caching, threshold=None, hysteresis=0)
    return BlockManager(pool_sizes[0], bs, enable_prefix_caching)


def sequence_blocks(block_manager: BlockManager | PooledBlockManager) -> int:
    """The most blocks one sequence can hold: both pools under switching, the approximate pool with a reserve."""
    if not isinstance(block_manager, PooledBlockManager):
        return block_manager.num_blocks
    if block_manager.threshold is not None:
        return min(p.num_blocks for p in block_manager.pools.values())
    return block_manager.approximate_pool.num_blocks


def final_length(seq: Sequence) -> int:
    return len(seq) + max(0, seq.params.max_tokens - seq.num_completion_tokens)


class ReserveFallback:
    """The fallback half of an ApproximationCheck: move a sequence to the exact pool, recomputed."""

    def __init__(self, block_manager: BlockManager | PooledBlockManager, requeue: Callable[[Sequence], None], max_len: int) -> None:
        self.block_manager = block_manager
        self.requeue = requeue
        self.max_len = max_len  # positions the model can take (max_position_embeddings)

    def exact_blocks(self) -> int:
        """Blocks an exact-path sequence may use: the reserve, or the whole pool when it is shared."""
        bm = self.block_manager
        if isinstance(bm, PooledBlockManager):
            return bm.exact_pool.num_blocks
        return bm.num_blocks

    def can_fall_back(self, seq: Sequence) -> bool:
        # Its whole remaining life must fit the exact pool, else it could never be scheduled there.
        final_len = final_length(seq)
        return final_len <= min(self.exact_blocks() * self.block_manager.block_size, self.max_len)

    def fall_back(self, seq: Sequence) -> None:
        seq.exact_path = True
        self.requeue(seq)


def reserve_feed(block_manager: BlockManager | PooledBlockManager) -> ReserveSection:
    """The stats feed's `validation.reserve`: exact-pool blocks, their use, sequences there, and
    fallbacks that found it full and waited (0 blocks: no separate reserve)."""
    bm = block_manager
    if isinstance(bm, PooledBlockManager) and bm.threshold is None:
        pool = bm.exact_pool
        return ReserveSection(
            blocks_total=pool.num_blocks,
            blocks_used=pool.num_used_blocks,
            sequences=bm.sequences_per_pool()[EXACT],
            full_total=bm.reserve_full_total,
        )
    return ReserveSection(**IDLE_RESERVE)
