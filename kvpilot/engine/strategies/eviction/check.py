"""Eviction at run time: the policy from the config, the pool-size check, and its ApproximationCheck."""

from __future__ import annotations

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.core.pools import BlockManagerLike
from kvpilot.engine.core.reserve import sequence_blocks
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.strategies.eviction.policy import EvictionPolicy
from kvpilot.engine.validation.full_context import FullContextCheck


def eviction_policy(config: EngineConfig) -> EvictionPolicy:
    c = config
    return EvictionPolicy.from_tokens(
        c.eviction, c.eviction_sinks, c.eviction_window, c.eviction_ladder_span, c.block_size
    )


def check_pool_fits(policy: EvictionPolicy, block_manager: BlockManagerLike, max_model_len: int, chunk_tokens: int) -> None:
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


class EvictionCheck(FullContextCheck):
    """Eviction's check: exact = full context recomputed; fallback = recompute the sequence unevicted
    in the fallback reserve, or in the shared pool when there is none (validation/full_context.py)."""

    name = "eviction"

    def applies(self, seq: Sequence) -> bool:
        return seq.num_evicted_tokens > 0 and not seq.exact_path
