"""Runtime validation of 8-bit KV (int8 / fp8 caches, layer.py) through ApproximationCheck.

The original 16-bit K/V are not kept once quantised, so the exact side is a recomputation from the
tokens (`DenseRecompute`): the model run densely in its own dtype, no cache, at the validated
layer. The served side is that layer's output of the decode step, which attended over the
dequantised 8-bit K/V (and, at deeper layers, carries earlier layers' quantisation effects).

Exact path: under `kv_cache_dtype=auto` switching there is a 16-bit pool; a sequence that fails is
recomputed there (pools.PooledBlockManager binds `exact_path` sequences to the 16-bit pool).
With a forced `int8`/`fp8` cache there is no 16-bit pool: the check counts and warns only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.strategies.kv_quant.pools import POOL8
from kvpilot.engine.validation.runner import DenseRecompute


class KVQuantCheck(DenseRecompute):
    """8-bit KV against a full-precision recomputation; fallback to the 16-bit pool where one exists."""

    def __init__(self, runner: Any, block_manager: Any, requeue: Callable[[Sequence], None]) -> None:
        super().__init__(runner)
        self.block_manager = block_manager
        self.requeue = requeue
        layout = runner.kv_layout
        self.name = f"kv_{layout.quant}"
        self.switching = layout.kind == "auto-switch"

    def applies(self, seq: Sequence) -> bool:
        if seq.exact_path:
            return False
        if not self.switching:
            return True
        return self.block_manager.pool_of(seq) == POOL8

    def can_fall_back(self, seq: Sequence) -> bool:
        return self.switching

    def fall_back(self, seq: Sequence) -> None:
        seq.exact_path = True
        self.requeue(seq)


def kv_quant_checks(runner: Any, block_manager: Any, requeue: Callable[[Sequence], None]) -> list[KVQuantCheck]:
    """The 8-bit KV check when the runner's cache has an 8-bit pool, else none."""
    return [KVQuantCheck(runner, block_manager, requeue)] if runner.kv_layout.is_quantised else []
