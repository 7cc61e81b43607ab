"""The Performer conversion at load: softmax attention layers become PerformerAttention ones."""

from __future__ import annotations

import torch
from torch import nn

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.layers.attention import Attention
from kvpilot.engine.strategies.linear.attention import PerformerAttention
from kvpilot.engine.strategies.linear.features import draw_features


def apply_linear(model: nn.Module, config: EngineConfig) -> int:
    """Convert the model when `attention="linear"` asks and `disable_linear` does not; return how many
    layers were converted (0: the checkpoint's attention is served). The knobs are checked in
    config/strategy.py before the weights load."""
    if config.attention != "linear" or config.disable_linear:
        return 0
    return convert_to_performer(model, config)


def convert_to_performer(model: nn.Module, config: EngineConfig) -> int:
    """Replace every paged softmax Attention of the model with a PerformerAttention; return how many.

    Features per layer and KV head come from a generator seeded with (linear_seed, layer): the same
    config always gives the same converted model.
    """
    converted = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not Attention:
                continue
            m = config.linear_features or child.head_dim
            gen = torch.Generator().manual_seed(config.linear_seed * 100_003 + converted)
            w = torch.stack([draw_features(m, child.head_dim, gen) for _ in range(child.num_kv_heads)])
            setattr(parent, name, PerformerAttention(child, config.linear_window, w))
            converted += 1
    if not converted:
        raise ValueError(
            f"attention='linear' found no softmax attention layer to convert in {type(model).__name__}; "
            "it applies to Llama/Qwen2/Mistral checkpoints"
        )
    return converted
