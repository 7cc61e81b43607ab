"""Two block pools in one block-id space, a sequence bound to one of them. Torch-free.

The exact pool holds ids [0, n16) and the approximate pool ids [n16, n16 + n8); the runner tells a
token's pool from its slot. Two uses, one mechanism:
- `kv_cache_dtype=auto` switching (strategies/kv_quant): a 16-bit and an int8 pool; a new sequence
  takes 8-bit once the running batch n >= threshold, 16-bit again once n < threshold - hysteresis
  (hysteresis keeps a batch that hovers at the threshold from flipping every admission).
- the fallback reserve (core/reserve.py): every new sequence takes the approximate pool (8-bit
  K/V, an MLA latent, an evicting or Performer view); the exact pool is a bounded reserve for
  sequences that runtime validation moved to the exact path (`seq.exact_path`).
In both, an `exact_path` sequence always takes the exact pool.

A sequence is bound to one pool from its first allocation until it holds no blocks (finished,
aborted or preempted); a preempted sequence is new again when it is re-admitted. Each pool has its
own prefix cache (a block's bytes differ between pools). The Scheduler sees the BlockManager
interface; its preemption picks victims without regard to pools, so freeing a victim in the other
pool does not help and it preempts further (correct, and only when one pool is exhausted); a
sequence waiting for a full exact pool waits at the head of the queue until blocks free.
"""

from __future__ import annotations

from kvpilot.engine.core.block_manager import BlockManager
from kvpilot.engine.core.sequence import Sequence

POOL16, POOL8 = "16", "8"  # the exact pool and the approximate one
EXACT, APPROXIMATE = POOL16, POOL8


class PooledBlockManager:
    """BlockManager interface over an exact pool and an approximate pool (one block-id space).

    `threshold` set: `kv_cache_dtype=auto` switching, new sequences pick by running batch size.
    `threshold=None`: a fallback reserve, every new sequence takes the approximate pool and only
    `exact_path` sequences (moved there by runtime validation) take the exact one.
    """

    def __init__(
        self,
        num_blocks16: int,
        num_blocks8: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        threshold: int | None = 32,
        hysteresis: int = 8,
    ) -> None:
        if (threshold is not None and threshold < 1) or hysteresis < 0:
            raise ValueError(
                f"threshold must be >= 1 (or None: never switch) and hysteresis >= 0, got {threshold}, {hysteresis}"
            )
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.threshold = threshold
        self.hysteresis = hysteresis
        self.pools = {
            POOL16: BlockManager(num_blocks16, block_size, enable_prefix_caching),
            POOL8: BlockManager(num_blocks8, block_size, enable_prefix_caching, first_block_id=num_blocks16),
        }
        self.mode = POOL16 if threshold is not None else POOL8  # the pool new sequences get now
        self.switches_total = 0
        self._bound: dict[str, str] = {}  # request id -> pool, while the sequence holds blocks
        self._waiting_exact: set[str] = set()  # exact-path sequences the full reserve could not admit yet
        self.reserve_full_total = 0  # such waits, one per sequence and wait

    # -- the choice ----------------------------------------------------------------------
    def pool_of(self, seq: Sequence) -> str:
        """seq's pool: its own while it holds blocks, else the one new sequences get now."""
        bound = self._bound.get(seq.request_id)
        if bound is not None:
            return bound
        if seq.exact_path:  # runtime validation moved it to the exact path (validation/runner.py)
            return POOL16
        if self.threshold is None:
            return POOL8
        running = len(self._bound)
        if self.mode == POOL16 and running >= self.threshold:
            self.mode, self.switches_total = POOL8, self.switches_total + 1
        elif self.mode == POOL8 and running < self.threshold - self.hysteresis:
            self.mode, self.switches_total = POOL16, self.switches_total + 1
        return self.mode

    def manager_of(self, seq: Sequence) -> BlockManager:
        return self.pools[self.pool_of(seq)]

    @property
    def exact_pool(self) -> BlockManager:
        return self.pools[POOL16]

    @property
    def approximate_pool(self) -> BlockManager:
        return self.pools[POOL8]

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
        ok = pool.can_allocate(seq, num_new_tokens, hits, reserve)
        if not ok and seq.exact_path and self.threshold is None and seq.request_id not in self._waiting_exact:
            self._waiting_exact.add(seq.request_id)  # a fallback found the reserve full: it waits, preempted
            self.reserve_full_total += 1
        return ok

    def allocate(self, seq: Sequence, num_new_tokens: int, hits: list[tuple[int, int]] | None = None) -> None:
        name = self.pool_of(seq)
        self.pools[name].allocate(seq, num_new_tokens, hits)
        self._bound[seq.request_id] = name
        self._waiting_exact.discard(seq.request_id)

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
        self._waiting_exact.discard(seq.request_id)
        if name is None and seq.block_table:
            raise AssertionError(f"{seq.request_id} holds blocks {seq.block_table} but is bound to no pool")
        self.pools[name or POOL16].deallocate(seq)  # with no blocks this only resets seq's counters


BlockManagerLike = BlockManager | PooledBlockManager  # what the engine holds: one pool or two
