"""The model's architecture as kvpilot reads it from an HF config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpilot.engine.config.deepseek import DEEPSEEK_FAMILIES, DeepseekFields, deepseek_fields
from kvpilot.engine.config.minimax import HybridFields
from kvpilot.strategy_schema import configured_window

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "MiniMaxForCausalLM": "minimax",
}


@dataclass
class ModelConfig:
    """The architecture fields kvpilot uses, read from an HF config.json."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    torch_dtype: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None = None
    deepseek: DeepseekFields | None = None  # MLA / MoE fields of DeepSeek-V2/V3 (config/deepseek.py)
    hybrid: HybridFields | None = None  # MiniMax layer types, MoE, residual factors (config/minimax.py)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: a model directory needs an HF-format config.json")
        raw = json.loads(path.read_text())
        config = cls.from_dict(raw, source=str(path))
        generation = Path(model_dir) / "generation_config.json"
        if generation.is_file():  # instruct models often list extra end-of-turn ids only here
            extra = json.loads(generation.read_text()).get("eos_token_id")
            extra = extra if isinstance(extra, list) else ([] if extra is None else [extra])
            config.eos_token_ids += tuple(int(i) for i in extra if int(i) not in config.eos_token_ids)
        return config

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> ModelConfig:
        archs = raw.get("architectures") or []
        family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if family is None:
            family = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "minimax": "minimax",
                      **{f: f for f in DEEPSEEK_FAMILIES}}.get(
                raw.get("model_type", "")
            )
        if family is None:
            raise ValueError(
                f"{source}: architectures={archs} model_type={raw.get('model_type')!r} is not supported; "
                f"kvpilot runs {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        quant = raw.get("quantization_config")
        if quant:
            method = quant.get("quant_method") if isinstance(quant, dict) else quant
            raise ValueError(
                f"{source}: quantization_config (quant_method {method!r}): kvpilot loads unquantised weights only "
                "(float32/float16/bfloat16 safetensors); serve the unquantised checkpoint (kv_cache_dtype int8 or "
                "fp8 quantises the KV cache instead)"
            )
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            family=family,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(
                raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0))
            ),
            rope_scaling=None if family in DEEPSEEK_FAMILIES else _rope_scaling(raw),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=family == "qwen2" or bool(raw.get("attention_bias", False)),
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            sliding_window=configured_window(raw),
            deepseek=deepseek_fields(family, raw, source) if family in DEEPSEEK_FAMILIES else None,
            hybrid=HybridFields.from_dict(raw, source) if family == "minimax" else None,
        )


def _rope_scaling(raw: dict[str, Any]) -> dict[str, Any] | None:
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported; kvpilot supports 'llama3' or none")
    return dict(scaling)
