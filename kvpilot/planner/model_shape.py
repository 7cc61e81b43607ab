"""The shape of a model that decides its memory: read from an HF `config.json` dict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.planner.dtypes import weight_dtype_bytes
from kvpilot.planner.errors import PlannerError

FULL, LINEAR = "full", "linear"


@dataclass(frozen=True)
class MlaShape:
    """DeepSeek-V2/V3 multi-head latent attention: what each token caches and how Q/K/V are built."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None


@dataclass(frozen=True)
class MoeShape:
    """Mixture-of-experts MLP: routed and shared experts, and how many leading layers stay dense."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int
    dense_layers: int


@dataclass(frozen=True)
class ModelShape:
    """Everything about a model that the capacity plan needs, and nothing else."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2  # compute/activation dtype (torch_dtype); `auto` KV uses it
    weight_dtype_bytes: int | None = None  # stored weights when quantised (fp8), else dtype_bytes
    tie_word_embeddings: bool = False
    mla: MlaShape | None = None
    moe: MoeShape | None = None
    layer_kinds: tuple[str, ...] = ()  # FULL or LINEAR per layer; empty means all FULL

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                     "vocab_size", "dtype_bytes"):
            if getattr(self, name) < 1:
                raise PlannerError(f"model {name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_kv_heads:
            raise PlannerError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.layer_kinds and len(self.layer_kinds) != self.num_layers:
            raise PlannerError(
                f"the per-layer attention list has {len(self.layer_kinds)} entries but the model has "
                f"{self.num_layers} layers"
            )

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.layer_kinds or (FULL,) * self.num_layers

    @property
    def num_full_layers(self) -> int:
        return self.kinds.count(FULL)

    @property
    def num_linear_layers(self) -> int:
        return self.kinds.count(LINEAR)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """Llama, Qwen2, Mistral, DeepSeek-V2/V3 and MiniMax configs (a `config.json` as a dict); a
        PlannerError naming the field for one that is missing, not a positive integer, or not an object."""
        if not isinstance(config, Mapping):
            raise PlannerError(f"a model config must be a JSON object (an HF config.json), got a {type(config).__name__}")
        text = config.get("text_config")
        if text is not None and not isinstance(text, Mapping):
            raise PlannerError(f"model config text_config must be an object, got a {type(text).__name__}")
        cfg = dict(text or config)
        try:
            return cls._from(cfg)
        except PlannerError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:  # a nested field that is not a number
            raise PlannerError(f"model config: a field is not a positive integer ({exc}); check config.json") from exc

    @classmethod
    def _from(cls, cfg: dict[str, Any]) -> ModelShape:
        model_type = str(cfg.get("model_type", "llama"))
        hidden = _required(cfg, "hidden_size")
        heads = _required(cfg, "num_attention_heads")
        layers = _required(cfg, "num_hidden_layers")
        kv_heads = _optional(cfg, "num_key_value_heads", heads)
        head_dim = _optional(cfg, "head_dim", max(1, hidden // heads))
        return cls(
            model_type=model_type,
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=_optional(cfg, "intermediate_size", 4 * hidden),
            vocab_size=_required(cfg, "vocab_size"),
            dtype_bytes=weight_dtype_bytes(cfg.get("torch_dtype") or cfg.get("dtype")),
            weight_dtype_bytes=_quantised_weight_bytes(cfg),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            mla=_mla(cfg),
            moe=_moe(cfg, layers),
            layer_kinds=_layer_kinds(cfg, layers),
        )


def _required(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg.get(key)
    if value is None:
        raise PlannerError(f"model config has no {key!r}; an HF config.json (Llama, Qwen2, Mistral, "
                           "DeepSeek-V2/V3, MiniMax) always names it")
    return _positive(key, value)


def _optional(cfg: Mapping[str, Any], key: str, default: int) -> int:
    """`key` when the config gives it (a positive integer: 0 is refused, not read as 'absent'), else default."""
    value = cfg.get(key)
    return default if value is None else _positive(key, value)


def _positive(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (
        float("inf"), float("-inf")) or int(value) != value or value < 1:  # fmt: skip
        raise PlannerError(f"model config {key} must be a positive integer, got {value!r}")
    return int(value)


def _quantised_weight_bytes(cfg: Mapping[str, Any]) -> int | None:
    # DeepSeek-V3 ships fp8 weights and says so in quantization_config, not in torch_dtype.
    quant = cfg.get("quantization_config") or {}
    return 1 if str(quant.get("quant_method", "")).lower() == "fp8" else None


def _mla(cfg: Mapping[str, Any]) -> MlaShape | None:
    if not cfg.get("kv_lora_rank"):
        return None
    return MlaShape(
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim", 64)),
        qk_nope_head_dim=int(cfg.get("qk_nope_head_dim", 128)),
        v_head_dim=int(cfg.get("v_head_dim", 128)),
        q_lora_rank=int(cfg["q_lora_rank"]) if cfg.get("q_lora_rank") else None,
    )


def _moe(cfg: Mapping[str, Any], layers: int) -> MoeShape | None:
    experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    if not experts:
        return None
    return MoeShape(
        num_experts=int(experts),
        experts_per_token=int(cfg.get("num_experts_per_tok") or 2),
        expert_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")),
        num_shared_experts=int(cfg.get("n_shared_experts") or 0),
        dense_layers=min(layers, int(cfg.get("first_k_dense_replace") or 0)),
    )


def _layer_kinds(cfg: Mapping[str, Any], layers: int) -> tuple[str, ...]:
    # transformers' MiniMax: layer_types "full_attention"/"linear_attention";
    # MiniMax-Text-01's own config: attn_type_list, 0 = lightning (linear), 1 = softmax.
    if cfg.get("layer_types"):
        return tuple(LINEAR if "linear" in str(t) else FULL for t in cfg["layer_types"])
    if cfg.get("attn_type_list"):
        return tuple(FULL if int(t) == 1 else LINEAR for t in cfg["attn_type_list"])
    return ()
