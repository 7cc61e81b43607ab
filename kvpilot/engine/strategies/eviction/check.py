"""Eviction at run time: the policy from the config, the pool-size check, and its ApproximationCheck."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.strategies.eviction.policy import EvictionPolicy
from kvpilot.engine.validation.runner import DenseRecompute


def eviction_policy(config: EngineConfig) -> EvictionPolicy:
    c = config
    return EvictionPolicy.from_tokens(
        c.eviction, c.eviction_sinks, c.eviction_window, c.eviction_ladder_span, c.block_size
    )


def check_pool_fits(policy: EvictionPolicy, block_manager: Any, max_model_len: int, chunk_tokens: int) -> None:
    """Raise if one sequence's resident view plus one prefill chunk could not fit the KV pool."""
    bm = block_manager
    need = policy.max_resident_blocks(max_model_len, bm.block_size) + bm.blocks_for(chunk_tokens) + 1
    if need > bm.num_blocks:
        raise ValueError(
            f"eviction {policy.mode!r} keeps up to {need} blocks per sequence (sinks {policy.sink_blocks}, "
            f"window {policy.window_blocks}, chunk {bm.blocks_for(chunk_tokens)} blocks) but the KV pool has "
            f"{bm.num_blocks}; shrink eviction_window / eviction_sinks or give the KV cache more memory"
        )


class EvictionCheck(DenseRecompute):
    """Eviction's check: exact = full context recomputed; fallback = recompute the sequence unevicted.

    `requeue(seq)` frees the sequence's blocks and state and puts it first in the queue (the engine's).
    """

    name = "eviction"

    def __init__(self, runner: Any, block_manager: Any, requeue: Callable[[Sequence], None]) -> None:
        super().__init__(runner)
        self.block_manager = block_manager
        self.requeue = requeue

    def applies(self, seq: Sequence) -> bool:
        return seq.num_evicted_tokens > 0 and not seq.exact_path

    def can_fall_back(self, seq: Sequence) -> bool:
        # Its whole remaining life must fit the pool, else the exact sequence could never be scheduled.
        bm = self.block_manager
        final_len = len(seq) + max(0, seq.params.max_tokens - seq.num_completion_tokens)
        pool_tokens = bm.num_blocks * bm.block_size
        return final_len <= min(pool_tokens, self.runner.model_config.max_position_embeddings)

    def fall_back(self, seq: Sequence) -> None:
        seq.exact_path = True
        self.requeue(seq)
