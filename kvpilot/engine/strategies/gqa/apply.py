"""After the weights load: regroup a GQA-converted model's heads by key similarity when calibration text is given."""

from __future__ import annotations

from typing import Any

import torch

from kvpilot.engine.config.strategy import gqa_groups
from kvpilot.engine.strategies.calibration.capture import calibration_tokens


def apply_gqa(model: torch.nn.Module, config: Any, transform: Any, device: torch.device, world: int = 1
              ) -> list[list[int]] | None:  # fmt: skip
    """Calibrated grouping (strategies/gqa/calibrate.py) when `conversion_calibration` is set and the load
    transform merged heads; the per-layer head orders, or None (index grouping, as loaded)."""
    originals = getattr(transform, "originals", None)
    groups = gqa_groups(config)
    if not originals or groups is None:
        return None
    assert world == 1, "config/strategy.check_tensor_parallel refuses calibrated GQA under TP"
    from kvpilot.engine.strategies.gqa.calibrate import calibrate_gqa

    ids = calibration_tokens(config)
    assert ids is not None
    orders = calibrate_gqa(model, originals, groups, ids, device)
    originals.clear()  # the original projections are not kept beyond calibration
    return orders
