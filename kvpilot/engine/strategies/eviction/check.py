"""Eviction at run time: the policy from the config, the pool-size check, and its ApproximationCheck."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.strategies.eviction.policy import EvictionPolicy
from kvpilot.engine.strategies.fallback.reserve import ReserveFallback, sequence_blocks
from kvpilot.engine.validation.runner import DenseRecompute


def eviction_policy(config: EngineConfig) -> EvictionPolicy:
    c = config
    return EvictionPolicy.from_tokens(
        c.eviction, c.eviction_sinks, c.eviction_window, c.eviction_ladder_span, c.block_size
    )


def check_pool_fits(policy: EvictionPolicy, block_manager: Any, max_model_len: int, chunk_tokens: int) -> None:
    """Raise if one sequence's resident view plus one prefill chunk could not fit the KV pool (the
    approximate pool beside a fallback reserve)."""
    bm = block_manager
    blocks = sequence_blocks(bm)
    need = policy.max_resident_blocks(max_model_len, bm.block_size) + bm.blocks_for(chunk_tokens) + 1
    if need > blocks:
        raise ValueError(
            f"eviction {policy.mode!r} keeps up to {need} blocks per sequence (sinks {policy.sink_blocks}, "
            f"window {policy.window_blocks}, chunk {bm.blocks_for(chunk_tokens)} blocks) but the KV pool has "
            f"{blocks} for it; shrink eviction_window / eviction_sinks, fallback_reserve, or give the KV "
            "cache more memory"
        )


class EvictionCheck(DenseRecompute, ReserveFallback):
    """Eviction's check: exact = full context recomputed; fallback = recompute the sequence unevicted
    in the fallback reserve (strategies/fallback), or in the shared pool when there is none.

    `requeue(seq)` frees the sequence's blocks and state and puts it first in the queue (the engine's).
    """

    name = "eviction"

    def __init__(self, runner: Any, block_manager: Any, requeue: Callable[[Sequence], None]) -> None:
        DenseRecompute.__init__(self, runner)
        ReserveFallback.__init__(self, block_manager, requeue, runner.model_config.max_position_embeddings)

    def applies(self, seq: Sequence) -> bool:
        return seq.num_evicted_tokens > 0 and not seq.exact_path
