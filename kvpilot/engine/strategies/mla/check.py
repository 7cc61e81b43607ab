"""Runtime validation of the MLA conversion (attention="mla", latent_rank r): exact side and fallback.

Exact side: the model run densely with every converted layer using the checkpoint's own K/V
projections (kept beside the factorisation). Fallback: the fallback reserve holds K/V blocks of the
unconverted layers (layers/reserve_attention.py); a failing sequence is flagged `exact_path`, its
latent blocks are freed, and it is recomputed there with the original attention
(core/reserve.py). Without a reserve (`fallback_reserve=0`) the check counts and warns only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvpilot.engine.core.pools import BlockManagerLike, PooledBlockManager
from kvpilot.engine.core.reserve import ReserveFallback
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.strategies.contract import RunnerView
from kvpilot.engine.strategies.mla.attention import ConvertedMlaAttention
from kvpilot.engine.validation.runner import DenseRecompute, forcing_exact


class MlaConversionCheck(DenseRecompute, ReserveFallback):
    """The MLA conversion's ApproximationCheck (validation/runner.py)."""

    name = "mla"

    def __init__(self, runner: RunnerView, block_manager: BlockManagerLike, requeue: Callable[[Sequence], None]) -> None:
        DenseRecompute.__init__(self, runner)
        ReserveFallback.__init__(self, block_manager, requeue, runner.model_config.max_position_embeddings)
        self.pooled = isinstance(block_manager, PooledBlockManager)

    def applies(self, seq: Sequence) -> bool:
        return not seq.exact_path

    def exact_attention(self, seq: Sequence, layer: int, num_tokens: int) -> torch.Tensor:
        with forcing_exact(self.runner.model, ConvertedMlaAttention):
            return super().exact_attention(seq, layer, num_tokens)

    def can_fall_back(self, seq: Sequence) -> bool:
        return self.pooled and ReserveFallback.can_fall_back(self, seq)


def mla_checks(runner: RunnerView, block_manager: BlockManagerLike, requeue: Callable[[Sequence], None]) -> list[MlaConversionCheck]:
    """The conversion's check when the runner serves converted layers, else none."""
    return [MlaConversionCheck(runner, block_manager, requeue)] if runner.mla.mode == "converted" else []
