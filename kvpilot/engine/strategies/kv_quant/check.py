"""Runtime validation of 8-bit KV (int8 / fp8 caches, kv_quant_cache.py) through ApproximationCheck.

The original 16-bit K/V are not kept once quantised, so the exact side is a recomputation from the
tokens (`DenseRecompute`): the model run densely in its own dtype, no cache, at the validated
layer. The served side is that layer's output of the decode step, which attended over the
dequantised 8-bit K/V (and, at deeper layers, carries earlier layers' quantisation effects).

Exact path: under `kv_cache_dtype=auto` switching there is a 16-bit pool; a sequence that fails is
recomputed there (kv_pools.PooledBlockManager binds `exact_path` sequences to the 16-bit pool).
With a forced `int8`/`fp8` cache there is no 16-bit pool: the check counts and warns only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpilot.engine.sequence import Sequence
from kvpilot.engine.validation_runner import DenseRecompute, requeue_for_recompute

if TYPE_CHECKING:
    from kvpilot.engine.llm_engine import LLMEngine


class KVQuantCheck(DenseRecompute):
    """8-bit KV against a full-precision recomputation; fallback to the 16-bit pool where one exists."""

    def __init__(self, engine: LLMEngine) -> None:
        super().__init__(engine)
        layout = engine.runner.kv_layout
        self.name = f"kv_{layout.quant}"
        self.switching = layout.kind == "auto-switch"

    def applies(self, seq: Sequence) -> bool:
        if seq.exact_path:
            return False
        if not self.switching:
            return True
        from kvpilot.engine.kv_pools import POOL8

        return self.engine.block_manager.pool_of(seq) == POOL8

    def can_fall_back(self, seq: Sequence) -> bool:
        return self.switching

    def fall_back(self, seq: Sequence) -> None:
        seq.exact_path = True
        requeue_for_recompute(self.engine, seq)


def kv_quant_checks(engine: LLMEngine) -> list[KVQuantCheck]:
    """The 8-bit KV check when this engine's cache has an 8-bit pool, else none."""
    layout = getattr(engine.runner, "kv_layout", None)
    return [KVQuantCheck(engine)] if layout is not None and layout.is_quantised else []
