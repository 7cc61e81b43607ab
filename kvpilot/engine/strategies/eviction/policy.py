"""KV eviction for long context: attention sinks + a recent window, optionally a ladder. Torch-free.

Whole blocks leave a sequence's block table and go back to the free list (no K/V is copied); keys
keep their RoPE positions and the kernels see a shorter context. Policies (`none`, `sinks`,
`ladder`), positions and the ladder's shape: docs/long_context.md, "Eviction".
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

from kvpilot.engine.config.strategy import EVICTION_MODES, check_eviction_tokens
from kvpilot.engine.core.block_manager import BlockManager
from kvpilot.engine.core.sequence import Sequence
from kvpilot.planner.eviction import max_resident_blocks


@dataclass(frozen=True)
class EvictionPolicy:
    """Which full blocks of a sequence stay resident, in block units."""

    mode: str = "none"
    sink_blocks: int = 1
    window_blocks: int = 64
    span_blocks: int = 64

    def __post_init__(self) -> None:
        if self.mode not in EVICTION_MODES:
            raise ValueError(f"eviction must be one of {EVICTION_MODES}, got {self.mode!r}")
        if self.sink_blocks < 0 or self.window_blocks < 1 or self.span_blocks < 1:
            raise ValueError(
                f"eviction needs sink_blocks >= 0, window_blocks >= 1 and span_blocks >= 1; got "
                f"{self.sink_blocks}, {self.window_blocks}, {self.span_blocks}"
            )

    @classmethod
    def from_tokens(cls, mode: str, sinks: int, window: int, span: int | None, block_size: int) -> EvictionPolicy:
        """Round token counts up to whole blocks (a window of W tokens keeps W..W+block_size-1)."""
        check_eviction_tokens(sinks, window, span)
        blocks = lambda n: -(-n // block_size)  # noqa: E731
        window_blocks = blocks(window)
        return cls(mode, blocks(sinks), window_blocks, blocks(span) if span else window_blocks)

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    def keeps(self, j: int, num_full_blocks: int) -> bool:
        """Whether full block j stays resident once the sequence has num_full_blocks full blocks."""
        if self.mode == "none" or j < self.sink_blocks:
            return True
        window_start = num_full_blocks - self.window_blocks
        if j >= window_start:
            return True
        if self.mode == "sinks":
            return False
        level = 1 + (window_start - 1 - j) // self.span_blocks
        return j % (1 << level) == 0

    def kept(self, num_full_blocks: int) -> list[int]:
        """Logical indices of the resident full blocks, ascending."""
        return [j for j in range(num_full_blocks) if self.keeps(j, num_full_blocks)]

    def max_resident_blocks(self, max_len_tokens: int, block_size: int) -> int:
        """An upper bound on the full blocks one sequence keeps, at any length up to max_len_tokens."""
        return max_resident_blocks(self.mode, self.sink_blocks, self.window_blocks, self.span_blocks, max_len_tokens,
                                   block_size)  # the capacity planner's bound, one formula


class Evictor:
    """Applies an EvictionPolicy to sequences after each step, freeing the blocks it drops."""

    def __init__(
        self,
        policy: EvictionPolicy,
        block_manager: BlockManager,
        manager_for: Callable[[Sequence], BlockManager] | None = None,
    ) -> None:
        self.policy = policy
        self.block_manager = block_manager
        # the BlockManager holding a sequence's blocks (one of several under kv_cache_dtype=auto pools)
        self.manager_for = manager_for or (lambda _seq: block_manager)
        self.block_size = block_manager.block_size
        self.evicted_blocks_total = 0
        # full-block count at each sequence's last eviction; its table is kept(F) + newer blocks
        self._last_full: weakref.WeakKeyDictionary[Sequence, int] = weakref.WeakKeyDictionary()

    def table_logical_blocks(self, seq: Sequence) -> list[int]:
        """The logical block index of each entry of seq's block table."""
        last = self._last_full.get(seq, 0) if seq.num_evicted_tokens else 0
        kept = self.policy.kept(last)
        return kept + list(range(last, last + len(seq.block_table) - len(kept)))

    def evict(self, seq: Sequence) -> int:
        """Drop seq's blocks that the policy no longer keeps; return how many were freed."""
        if not self.policy.enabled or seq.exact_path or seq.is_finished or not seq.block_table:
            return 0
        full = seq.num_computed_tokens // self.block_size
        if full <= self.policy.sink_blocks + self.policy.window_blocks:
            return 0
        logical = self.table_logical_blocks(seq)
        drop = [i for i, j in enumerate(logical) if j < full and not self.policy.keeps(j, full)]
        if drop:
            self.manager_for(seq).release_blocks(seq, drop)
            seq.num_evicted_tokens += len(drop) * self.block_size
            self.evicted_blocks_total += len(drop)
        self._last_full[seq] = full
        return len(drop)
