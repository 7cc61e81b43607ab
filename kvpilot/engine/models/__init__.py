"""Model families by name; Mistral runs on the Llama implementation (no sliding window)."""

from __future__ import annotations

from torch import nn

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.models.llama import LlamaForCausalLM
from kvpilot.engine.models.qwen2 import Qwen2ForCausalLM

MODEL_CLASSES: dict[str, type[LlamaForCausalLM]] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
}


def build_model(config: ModelConfig) -> nn.Module:
    try:
        cls = MODEL_CLASSES[config.family]
    except KeyError:
        raise ValueError(
            f"model family {config.family!r} is not supported; choose one of {sorted(MODEL_CLASSES)}"
        ) from None
    return cls(config)
