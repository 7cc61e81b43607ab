"""After the weights load: regroup and re-merge a GQA-converted model's heads (with compensation) when calibration text is given."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from kvpilot.engine.config.strategy import gqa_groups
from kvpilot.engine.strategies.calibration.capture import calibration_tokens
from kvpilot.engine.strategies.gqa.reserve import gqa_reserve_applies, wrap_for_reserve


def apply_gqa(model: torch.nn.Module, config: Any, transform: Any, device: torch.device, world: int = 1
              ) -> list[list[int]] | None:  # fmt: skip
    """After a GQA load: calibrated grouping and compensated merge (calibrate.py, compensate.py) when
    `conversion_calibration` is set, then the original K/V projections (and o_proj, when compensated)
    kept for the fallback reserve (reserve.py) when one applies; the per-layer head orders, or None
    (index grouping, as loaded)."""
    originals = getattr(transform, "originals", None)
    groups = gqa_groups(config)
    if not originals or groups is None:
        return None
    orders = None
    heads = next(iter(originals.values())).shape[0] // model.model.layers[0].self_attn.head_dim
    reserve = gqa_reserve_applies(config, heads, world)
    if config.conversion_calibration is not None:
        assert world == 1, "config/strategy.check_tensor_parallel refuses calibrated GQA under TP"
        from kvpilot.engine.strategies.gqa.calibrate import calibrate_gqa

        ids = calibration_tokens(config)
        assert ids is not None
        orders = calibrate_gqa(model, originals, groups, ids, device, keep_output=reserve)
    if reserve:
        wrap_for_reserve(model, originals)
    originals.clear()  # what the reserve needs is now held by its layers
    for layer in model.model.layers:  # the original o_proj that value compensation kept: the reserve's copy, if any
        attn = getattr(layer.self_attn, "src", layer.self_attn)  # GqaReserveAttention wraps the layer
        comp = getattr(attn, "gqa_compensation", None)
        if comp is not None:
            attn.gqa_compensation = replace(comp, output_weight=None)
    return orders
