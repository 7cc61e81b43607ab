"""MiniMax's hybrid config fields: which layers are lightning, MoE routing, residual factors."""

from __future__ import annotations

import pytest

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.config.minimax import FULL, LINEAR, HybridFields
from tests.helpers.minimax import minimax_config

pytestmark = pytest.mark.unit


def raw(**overrides):
    return {"architectures": ["MiniMaxForCausalLM"], **minimax_config(**overrides)}


def test_layer_types_experts_and_factors_are_read() -> None:
    mc = ModelConfig.from_dict(raw())
    assert mc.family == "minimax" and mc.hybrid is not None
    assert mc.hybrid.layer_types == (LINEAR, FULL, LINEAR, LINEAR)
    assert (mc.hybrid.num_linear_layers, mc.hybrid.num_full_layers) == (3, 1)
    assert (mc.hybrid.num_local_experts, mc.hybrid.num_experts_per_tok) == (4, 2)
    assert mc.hybrid.linear_attn_alpha_factor == 0.9 and mc.hybrid.mlp_beta_factor == 0.95
    assert mc.rope_theta == 10000.0


def test_attn_type_list_of_original_checkpoints_and_hf_default() -> None:
    config = raw(layer_types=None, attn_type_list=[0, 0, 1, 0])
    assert HybridFields.from_dict(config).layer_types == (LINEAR, LINEAR, FULL, LINEAR)
    config = raw(layer_types=None)
    assert HybridFields.from_dict(config).layer_types == (FULL, LINEAR, FULL, LINEAR)  # HF's alternation


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"layer_types": ["linear_attention", "sliding"] * 2}, "layer_types must list 4 entries"),
        ({"layer_types": ["linear_attention"] * 3}, "got 3 entries"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok <= num_local_experts"),
    ],
)
def test_bad_hybrid_fields_say_what_is_allowed(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(raw(**overrides))
