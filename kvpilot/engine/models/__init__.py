"""Model families by name; Mistral runs on the Llama implementation (its sliding window: config/sliding_window.py)."""

from __future__ import annotations

from torch import nn

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.models.deepseek_v2 import DeepseekV2ForCausalLM
from kvpilot.engine.models.llama import LlamaForCausalLM
from kvpilot.engine.models.minimax import MiniMaxForCausalLM
from kvpilot.engine.models.qwen2 import Qwen2ForCausalLM

MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "minimax": MiniMaxForCausalLM,  # type: ignore[dict-item]
    "deepseek_v2": DeepseekV2ForCausalLM,
    "deepseek_v3": DeepseekV2ForCausalLM,  # same MLA; V3's sigmoid/noaux_tc routing comes from the config
}


def build_model(config: ModelConfig) -> nn.Module:
    try:
        cls = MODEL_CLASSES[config.family]
    except KeyError:
        raise ValueError(
            f"model family {config.family!r} is not supported; choose one of {sorted(MODEL_CLASSES)}"
        ) from None
    return cls(config)
