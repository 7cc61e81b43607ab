"""Pure-torch silu(gate) * up (silu rounded to the activation dtype before the product, as torch does)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up
