"""GQA conversion at load: mean-pool each layer's k_proj/v_proj heads into kv_head_groups heads.

The runner builds the model with num_key_value_heads = kv_head_groups (kv_strategy.served_model_config)
and loads the checkpoint through this per-tensor transform (strategies/gqa_conversion.py's recipe),
so the converted model is an ordinary GQA model to every other part of the engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.kv_strategy import gqa_groups
from kvpilot.engine.strategies.gqa_conversion import mean_pool_heads

_KV_PROJ = re.compile(r"\.(k_proj|v_proj)\.(weight|bias)$")


def gqa_transform(
    config: EngineConfig, served: ModelConfig
) -> Callable[[str, torch.Tensor], torch.Tensor] | None:
    """The load transform for attention='gqa' (None when the checkpoint's heads are served as they are)."""
    groups = gqa_groups(config)
    if groups is None:
        return None
    head_dim = served.head_dim

    def pool(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if not _KV_PROJ.search(name):
            return tensor
        heads = tensor.shape[0] // head_dim
        return tensor if heads == groups else mean_pool_heads(tensor, heads, groups)

    return pool
