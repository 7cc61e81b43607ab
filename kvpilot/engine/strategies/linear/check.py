"""Runtime validation of the Performer conversion (attention="linear"): exact side and fallback.

Exact side: the model run densely with every converted layer forced to plain softmax attention.
Fallback: without eviction the converted layers keep every token's K/V in the paged cache, so an
exact path exists (with eviction, when the whole context fits the pool); the sequence is flagged
`exact_path` and recomputed from token 0 (its recurrent state is freed, its K/V rewritten by exact
attention, eviction skips it), after which it attends to its whole context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvpilot.engine.performer_attention import PerformerAttention
from kvpilot.engine.sequence import Sequence
from kvpilot.engine.validation_runner import EvictionCheck, forcing_exact, requeue_for_recompute

if TYPE_CHECKING:
    from kvpilot.engine.llm_engine import LLMEngine


class PerformerCheck(EvictionCheck):
    """The Performer conversion's ApproximationCheck (validation_runner.py); its exact path is the
    whole context, which must fit the KV pool when eviction dropped blocks (as EvictionCheck asks)."""

    name = "linear"

    def applies(self, seq: Sequence) -> bool:
        return not seq.exact_path

    def exact_attention(self, seq: Sequence, layer: int, num_tokens: int) -> torch.Tensor:
        with forcing_exact(self.engine.runner.model, PerformerAttention):
            return super().exact_attention(seq, layer, num_tokens)

    def can_fall_back(self, seq: Sequence) -> bool:
        return getattr(self.engine, "evictor", None) is None or super().can_fall_back(seq)

    def fall_back(self, seq: Sequence) -> None:
        seq.exact_path = True
        requeue_for_recompute(self.engine, seq)


def add_linear_checks(engine: LLMEngine) -> None:
    """Register the Performer check when the engine serves converted layers."""
    if any(isinstance(m, PerformerAttention) for m in engine.runner.model.modules()):
        engine.checks.add_check(PerformerCheck(engine))
