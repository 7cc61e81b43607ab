"""ModelConfig.from_dict refuses what the engine cannot load, saying what it can."""

from __future__ import annotations

import pytest

from kvpilot.engine.config import ModelConfig
from tests.helpers.model_configs import DEEPSEEK_V3_FP8, LLAMA3_8B

pytestmark = pytest.mark.unit


def test_a_quantised_checkpoint_is_refused_with_what_to_serve_instead() -> None:
    with pytest.raises(ValueError, match=r"quant_method 'fp8'.*unquantised weights only.*kv_cache_dtype int8 or fp8"):
        ModelConfig.from_dict(DEEPSEEK_V3_FP8, "m/config.json")
    with pytest.raises(ValueError, match=r"quant_method 'gptq'"):
        ModelConfig.from_dict({**LLAMA3_8B, "quantization_config": {"quant_method": "gptq", "bits": 4}})
    assert ModelConfig.from_dict({**LLAMA3_8B, "quantization_config": None}).family == "llama"
