"""Torch-free configuration: the engine's knobs, the model's architecture, and every strategy check."""

from kvpilot.engine.config.engine import DTYPES, EngineConfig
from kvpilot.engine.config.model import SUPPORTED_ARCHITECTURES, ModelConfig

__all__ = ["DTYPES", "SUPPORTED_ARCHITECTURES", "EngineConfig", "ModelConfig"]
