"""Engine configuration and the model's architecture read from config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpilot.engine.hybrid_config import HybridFields
from kvpilot.engine.mla_config import DEEPSEEK_FAMILIES, DeepseekFields, deepseek_fields

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "MiniMaxForCausalLM": "minimax",
}
DTYPES = ("auto", "float32", "float16", "bfloat16")


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
    deepseek: DeepseekFields | None = None  # MLA / MoE fields of DeepSeek-V2/V3 (mla_config.py)
    hybrid: HybridFields | None = None  # MiniMax layer types, MoE, residual factors (hybrid_config.py)

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
            sliding_window=raw.get("sliding_window") if raw.get("use_sliding_window", True) else None,
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


@dataclass
class EngineConfig:
    """Everything an LLMEngine needs: the model directory plus memory and batching limits."""

    model: str
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    cpu_kv_cache_bytes: int = 64 * 2**20
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    weight_sha256: dict[str, str] = field(default_factory=dict)
    strategy: str = "native"
    kv_cache_dtype: str = "auto"
    show_progress: bool = True
    # Memory strategies (kv_strategy.py): GQA conversion and KV quantisation, each with its off switch.
    attention: str = "native"
    kv_head_groups: int | None = None
    disable_gqa: bool = False
    kv_quant_auto_threshold: int | None = None  # kv_cache_dtype=auto: int8 blocks at >= this batch
    kv_quant_auto_hysteresis: int | None = None  # back to 16-bit below threshold - this (threshold // 4)
    kv_quant_auto_split: float = 0.5  # share of the KV memory for the 16-bit pool under auto switching
    disable_kv_quant: bool = False
    latent_rank: int | None = None  # attention="mla" on an MHA/GQA checkpoint: SVD latent width (mla_strategy.py)
    disable_mla: bool = False  # serve the checkpoint's own attention (native DeepSeek: no absorbed decode)
    # attention="linear" on a softmax checkpoint (performer_attention.py): exact window + summary
    linear_window: int = 64  # most recent tokens attended exactly (the query's own included)
    linear_features: int | None = None  # random features per KV head (None: head_dim)
    linear_seed: int = 0  # seeds the feature draw (part of the converted model)
    disable_linear: bool = False  # serve the checkpoint's softmax attention
    # Long-context eviction (eviction.py): none | sinks | ladder; token counts, rounded up to blocks
    eviction: str = "none"
    eviction_sinks: int = 4
    eviction_window: int = 1024
    eviction_ladder_span: int | None = None  # blocks before the window per ladder level (None: window)
    # Runtime validation (validation_runner.py) and sampled head utilisation (head_utilization.py)
    validate_every: int = 100  # decode tokens between checks of one sequence
    validation_sample_rate: float = 0.1  # share of sequences checked (by request id hash)
    validation_layer: int = 0  # the layer compared (negative: from the end); a check costs ~(layer+1)/L of a prefill
    validation_threshold: float = 0.92  # cosine below this moves the sequence to the exact path
    head_utilization_every: int = 64  # decode steps between gqa_head_utilization samples (0: off)
    cuda_graphs: bool = False  # replay captured CUDA graphs for decode-only steps (cuda_graphs.py)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 1, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(
                f"num_kv_blocks must be >= 1 or None (size automatically), got {self.num_kv_blocks}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(
                f"max_model_len must be >= 2 or None (from config.json), got {self.max_model_len}"
            )
        from kvpilot.engine.eviction import check_eviction_config
        from kvpilot.engine.kv_strategy import check_kv_strategy

        check_eviction_config(self)

        check_kv_strategy(self)
        if self.linear_window < 1 or (self.linear_features is not None and self.linear_features < 1):
            raise ValueError(
                f"linear_window ({self.linear_window}) and linear_features ({self.linear_features}) must be >= 1"
            )
        if self.latent_rank is not None and self.latent_rank < 1:
            raise ValueError(f"latent_rank must be >= 1 or None (a DeepSeek model's own kv_lora_rank), got {self.latent_rank}")
