"""Runtime validation of 8-bit KV (int8 / fp8 caches, layer.py) through ApproximationCheck.

The original 16-bit K/V are not kept once quantised, so the exact side is a recomputation from the
tokens (`DenseRecompute`): the model run densely in its own dtype, no cache, at the validated
layer. The served side is that layer's output of the decode step, which attended over the
dequantised 8-bit K/V (and, at deeper layers, carries earlier layers' quantisation effects).

Exact path: a 16-bit pool, the fallback reserve of an int8/fp8 cache (core/reserve.py) or
the 16-bit pool of `kv_cache_dtype=auto` switching; a sequence that fails is recomputed there
(core/pools.PooledBlockManager binds `exact_path` sequences to it). With `fallback_reserve=0` an
int8/fp8 cache has no 16-bit pool: the check counts and warns only.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpilot.engine.core.pools import POOL8, BlockManagerLike, PooledBlockManager
from kvpilot.engine.core.reserve import ReserveFallback
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.strategies.contract import RunnerView
from kvpilot.engine.validation.runner import DenseRecompute


class KVQuantCheck(DenseRecompute, ReserveFallback):
    """8-bit KV against a full-precision recomputation; fallback to the 16-bit pool where one exists."""

    def __init__(self, runner: RunnerView, block_manager: BlockManagerLike, requeue: Callable[[Sequence], None]) -> None:
        DenseRecompute.__init__(self, runner)
        ReserveFallback.__init__(self, block_manager, requeue, runner.model_config.max_position_embeddings)
        self.name = f"kv_{runner.kv_layout.quant}"
        self.pooled = isinstance(block_manager, PooledBlockManager)

    def applies(self, seq: Sequence) -> bool:
        if seq.exact_path:
            return False
        return not self.pooled or self.block_manager.pool_of(seq) == POOL8

    def can_fall_back(self, seq: Sequence) -> bool:
        return self.pooled and ReserveFallback.can_fall_back(self, seq)


def kv_quant_checks(runner: RunnerView, block_manager: BlockManagerLike, requeue: Callable[[Sequence], None]) -> list[KVQuantCheck]:
    """The 8-bit KV check when the runner's cache has an 8-bit pool, else none."""
    return [KVQuantCheck(runner, block_manager, requeue)] if runner.kv_layout.is_quantised else []
