"""The check of an approximation whose exact path is the whole context over the same cache.

Exact side: the context recomputed densely (validation/runner.DenseRecompute). Fallback: the
sequence recomputed from token 0 in the fallback reserve, or in the shared pool when there is none
(core/reserve.ReserveFallback). Eviction's check and the Performer conversion's both are this.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpilot.engine.core.pools import BlockManagerLike
from kvpilot.engine.core.reserve import ReserveFallback
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.validation.runner import DenseRecompute, ValidatedRunner


class FullContextCheck(DenseRecompute, ReserveFallback):
    """`requeue(seq)` frees the sequence's blocks and state and puts it first in the queue (the engine's)."""

    name = "full_context"

    def __init__(self, runner: ValidatedRunner, block_manager: BlockManagerLike, requeue: Callable[[Sequence], None]) -> None:
        DenseRecompute.__init__(self, runner)
        ReserveFallback.__init__(self, block_manager, requeue, runner.model_config.max_position_embeddings)

    def applies(self, seq: Sequence) -> bool:
        return not seq.exact_path
