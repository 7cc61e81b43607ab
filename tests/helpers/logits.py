"""Logits a model computes during a run, kept in order (the engine's own compute_logits, wrapped)."""

from __future__ import annotations

from typing import Any

import torch


def record_logits(model: Any) -> list[torch.Tensor]:
    """Wrap `model.compute_logits` so every call's output is also appended (a detached copy) to the list returned."""
    logits: list[torch.Tensor] = []
    compute_logits = model.compute_logits

    def recorded(hidden: torch.Tensor) -> torch.Tensor:
        out = compute_logits(hidden)
        logits.append(out.detach().clone())
        return out

    model.compute_logits = recorded
    return logits
