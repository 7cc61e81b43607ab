"""Runtime validation of the MLA conversion (attention="mla", latent_rank r).

Exact side: the model run densely with every converted layer using the checkpoint's own K/V
projections (kept beside the factorisation). No fallback: the paged cache of a converted model
holds rank-r latents, not K/V, so there is no exact paged path for a running sequence; a cosine
below the threshold is logged as a warning and shows in `validation.last_cosine` (the remedy is a
higher latent_rank or --disable-mla, both deployment settings).
"""

from __future__ import annotations

from typing import Any

import torch

from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.strategies.mla.attention import ConvertedMlaAttention
from kvpilot.engine.validation.runner import DenseRecompute, forcing_exact


class MlaConversionCheck(DenseRecompute):
    """The MLA conversion's ApproximationCheck (validation/runner.py)."""

    name = "mla"

    def applies(self, seq: Sequence) -> bool:
        return True

    def exact_attention(self, seq: Sequence, layer: int, num_tokens: int) -> torch.Tensor:
        with forcing_exact(self.runner.model, ConvertedMlaAttention):
            return super().exact_attention(seq, layer, num_tokens)

    def can_fall_back(self, seq: Sequence) -> bool:
        return False

    def fall_back(self, seq: Sequence) -> None:  # pragma: no cover - can_fall_back is always False
        raise RuntimeError("the MLA conversion has no exact paged path to fall back to")


def mla_checks(runner: Any) -> list[MlaConversionCheck]:
    """The conversion's check when the runner serves converted layers, else none."""
    return [MlaConversionCheck(runner)] if runner.mla.mode == "converted" else []
