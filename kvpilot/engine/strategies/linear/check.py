"""Runtime validation of the Performer conversion (attention="linear"): exact side and fallback.

Exact side: the model run densely with every converted layer forced to plain softmax attention.
Fallback: the converted layers keep every token's K/V in the paged cache (without eviction), so an
exact path exists whenever the whole context fits the exact pool (the fallback reserve,
core/reserve.py, or the shared pool without one); the sequence is flagged `exact_path` and
recomputed from token 0 there (its recurrent state is freed, its K/V rewritten by exact attention,
eviction skips it), after which it attends to its whole context.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvpilot.engine.core.pools import BlockManagerLike
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.strategies.contract import RunnerView
from kvpilot.engine.strategies.linear.attention import PerformerAttention
from kvpilot.engine.validation.full_context import FullContextCheck
from kvpilot.engine.validation.runner import forcing_exact


class PerformerCheck(FullContextCheck):
    """The Performer conversion's ApproximationCheck (validation/runner.py); its exact path is the
    whole context, which must fit the exact pool (validation/full_context.py)."""

    name = "linear"

    def __init__(
        self, runner: RunnerView, block_manager: BlockManagerLike, requeue: Callable[[Sequence], None], evicting: bool
    ) -> None:
        super().__init__(runner, block_manager, requeue)
        self.evicting = evicting

    def exact_attention(self, seq: Sequence, layer: int, num_tokens: int) -> torch.Tensor:
        with forcing_exact(self.runner.model, PerformerAttention):
            return super().exact_attention(seq, layer, num_tokens)


def linear_checks(
    runner: RunnerView, block_manager: BlockManagerLike, requeue: Callable[[Sequence], None], evicting: bool
) -> list[PerformerCheck]:
    """The Performer check when the runner serves converted layers, else none."""
    if any(isinstance(m, PerformerAttention) for m in runner.model.modules()):
        return [PerformerCheck(runner, block_manager, requeue, evicting)]
    return []
