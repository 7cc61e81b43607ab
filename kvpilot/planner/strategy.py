"""A memory strategy and what it makes each sequence cache, per token and per sequence."""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.planner.dtypes import KV_CACHE_DTYPES, kv_dtype_bytes
from kvpilot.planner.errors import PlannerError
from kvpilot.planner.eviction import resident_blocks
from kvpilot.planner.model_shape import ModelShape
from kvpilot.strategy_schema import ATTENTIONS as ATTENTIONS
from kvpilot.strategy_schema import KV_SCALE_BYTES, default, kv_dtype

LINEAR_STATE_BYTES = 4  # the recurrent state phi(K)^T V and its normaliser are kept in fp32


@dataclass(frozen=True)
class KVStrategy:
    """How attention caches: `attention` with its parameter, the KV dtype, and the paging block.

    - `gqa`: `kv_head_groups` = number of KV heads after merging (groups of the model's KV heads
      are mean-pooled into one head each); it must divide the model's KV head count.
    - `mla`: `latent_rank` = width of the one latent vector cached per token and layer
      (default: the model's own `kv_lora_rank` for DeepSeek models); with `mla_rope_dims` R (the
      conversion's partial RoPE, non-DeepSeek models only) each KV head also caches R exact RoPE key
      dims beside it, so a row is latent_rank + num_kv_heads x R wide.
    - `linear` (the engine's Performer conversion): every layer keeps a fixed summary per sequence
      (KV heads x feature_dim x (head_dim + 1), fp32) and, in paged blocks, every token's K/V as `native`
      does: the exact window is read from them and a sequence that fails runtime validation falls back to
      exact attention over them (engine: strategies/linear). `linear_window` changes compute, not memory.
    """

    attention: str = default("attention")
    kv_head_groups: int | None = None
    latent_rank: int | None = None
    kv_cache_dtype: str = default("kv_cache_dtype")
    block_size: int = default("block_size")
    linear_window: int = default("linear_window")
    linear_feature_dim: int | None = None  # default: the model's head_dim
    scale_bytes: int = KV_SCALE_BYTES
    # runtime validation's exact-path reserve, a share of the KV pool (lossy strategies; planner/pools.py)
    fallback_reserve: float = default("fallback_reserve")
    kv_quant_auto_threshold: int | None = None  # auto: int8 blocks for new sequences at this batch size
    kv_quant_auto_split: float = default("kv_quant_auto_split")  # auto: share of the KV pool for 16-bit blocks
    # gqa/mla converted with a calibration set (the engine's conversion_calibration); a calibrated
    # GQA conversion with a reserve also keeps every layer's original o_proj (planner/pools.py)
    calibrated: bool = False
    mla_rope_dims: int | None = None  # mla conversion: dims per KV head that keep RoPE (None: every dim)
    # KV eviction (planner/eviction.py): a sequence keeps its sinks and recent window (and a ladder) resident
    eviction: str = default("eviction")
    eviction_sinks: int = default("eviction_sinks")
    eviction_window: int = default("eviction_window")
    eviction_ladder_span: int | None = default("eviction_ladder_span")

    def __post_init__(self) -> None:
        if self.attention not in ATTENTIONS:
            raise PlannerError(f"attention {self.attention!r} is not supported; choose one of {', '.join(ATTENTIONS)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise PlannerError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} is not supported; choose one of {', '.join(KV_CACHE_DTYPES)}"
            )
        if self.block_size < 1:
            raise PlannerError(f"block_size must be >= 1, got {self.block_size}")
        if self.attention == "gqa" and not self.kv_head_groups:
            raise PlannerError("attention 'gqa' needs kv_head_groups (the number of KV heads after merging)")
        if self.linear_window < 0:
            raise PlannerError(f"linear_window must be >= 0, got {self.linear_window}")
        if not 0.0 <= self.fallback_reserve < 1.0:
            raise PlannerError(f"fallback_reserve must be in [0, 1), got {self.fallback_reserve}")
        if self.kv_quant_auto_threshold is not None and self.kv_quant_auto_threshold < 1:
            raise PlannerError(f"kv_quant_auto_threshold must be >= 1, got {self.kv_quant_auto_threshold}")
        if self.mla_rope_dims is not None and (self.attention != "mla" or self.mla_rope_dims < 0
                                               or self.mla_rope_dims % 2):
            raise PlannerError(
                f"mla_rope_dims {self.mla_rope_dims} must be an even number >= 0 (RoPE rotates dims in pairs), "
                f"with attention 'mla' only (got {self.attention!r})"
            )
        if not 0.0 < self.kv_quant_auto_split < 1.0:
            raise PlannerError(f"kv_quant_auto_split must be in (0, 1), got {self.kv_quant_auto_split}")
        resident_blocks(self.eviction, self.eviction_sinks, self.eviction_window, self.eviction_ladder_span, 1,
                        self.block_size)  # the mode and token counts checked

    def resident_blocks(self, tokens: int) -> int:
        """Paged blocks one sequence of up to `tokens` tokens holds at once (all of them without eviction)."""
        return resident_blocks(self.eviction, self.eviction_sinks, self.eviction_window, self.eviction_ladder_span,
                               tokens, self.block_size)

    @property
    def label(self) -> str:
        """Short name for tables and the X-Model-Strategy header, e.g. `gqa4-int8`."""
        rope = "" if self.mla_rope_dims is None else f"rope{self.mla_rope_dims}"  # the engine's mla64rope16
        mla = None if self.latent_rank is None else f"{self.latent_rank}{rope}"
        param = {"gqa": self.kv_head_groups, "mla": mla, "linear": self.linear_window}
        name = f"{self.attention}{param.get(self.attention) or ''}"
        return name if self.kv_cache_dtype == "auto" else f"{name}-{self.kv_cache_dtype}"


@dataclass(frozen=True)
class KVFootprint:
    """Cache bytes of one sequence: growing per token and fixed."""

    bytes_per_token: int  # every token, for the whole sequence (paged layers)
    fixed_bytes_per_sequence: int  # recurrent states (hybrid linear layers, the Performer summary)

    def sequence_bytes(self, tokens: int, block_size: int) -> int:
        """Peak bytes of one sequence of `tokens` tokens, with paged blocks rounded up."""
        return _round_up(tokens, block_size) * self.bytes_per_token + self.fixed_bytes_per_sequence


def kv_footprint(model: ModelShape, strategy: KVStrategy) -> KVFootprint:
    """Bytes per token (all layers, K and V, scales included) and fixed bytes per sequence."""
    elem = kv_dtype_bytes(strategy.kv_cache_dtype, model.dtype_bytes)
    scale = strategy.scale_bytes if kv_dtype(strategy.kv_cache_dtype).token_scales else 0  # int8's; fp8's are per layer
    if strategy.attention == "linear":
        return _linear(model, strategy, elem, scale)
    vectors, width = _cached_vectors(model, strategy)  # per full layer and token: vectors x width
    per_layer = vectors * (width * elem + scale)
    return KVFootprint(
        bytes_per_token=model.num_full_layers * per_layer,
        fixed_bytes_per_sequence=model.num_linear_layers * _lightning_state_bytes(model),
    )


def _cached_vectors(model: ModelShape, strategy: KVStrategy) -> tuple[int, int]:
    if strategy.attention == "native":
        if model.mla:
            return 1, model.mla.kv_lora_rank + model.mla.qk_rope_head_dim
        return 2 * model.num_kv_heads, model.head_dim
    if strategy.attention == "gqa":
        groups = strategy.kv_head_groups or 0
        if model.mla:
            raise PlannerError("attention 'gqa' needs a model with K/V heads; this model caches an MLA latent")
        if groups < 1 or model.num_kv_heads % groups:
            raise PlannerError(
                f"kv_head_groups {groups} must divide the model's {model.num_kv_heads} KV heads "
                f"(allowed: {_divisors(model.num_kv_heads)})"
            )
        return 2 * groups, model.head_dim
    # mla
    native_rank = model.mla.kv_lora_rank if model.mla else None
    rank = strategy.latent_rank or native_rank
    if not rank:
        raise PlannerError("attention 'mla' needs latent_rank for a model without an MLA latent (kv_lora_rank)")
    full_width = 2 * model.num_kv_heads * model.head_dim
    if not model.mla and not 1 <= rank <= full_width:
        raise PlannerError(f"latent_rank {rank} must be between 1 and 2 x kv_heads x head_dim = {full_width}")
    if model.mla:
        if strategy.mla_rope_dims is not None:
            raise PlannerError(
                f"mla_rope_dims {strategy.mla_rope_dims} (spec.strategy.mlaRopeDims, --mla-rope-dims): this model "
                f"already has its own RoPE split "
                f"(qk_rope_head_dim={model.mla.qk_rope_head_dim}); leave mla_rope_dims unset"
            )
        return 1, rank + model.mla.qk_rope_head_dim
    return 1, rank + model.num_kv_heads * rope_dims(model, strategy)


def rope_dims(model: ModelShape, strategy: KVStrategy) -> int:
    """The MLA conversion's exact RoPE dims per KV head (partial RoPE), checked against the model's head_dim."""
    dims = strategy.mla_rope_dims or 0
    if dims > model.head_dim:
        raise PlannerError(
            f"mla_rope_dims {dims} (spec.strategy.mlaRopeDims, --mla-rope-dims) exceeds the model's head_dim "
            f"{model.head_dim}; choose an even number in "
            f"2..{model.head_dim}"
        )
    return dims


def _linear(model: ModelShape, strategy: KVStrategy, elem: int, scale: int) -> KVFootprint:
    if model.mla:
        raise PlannerError("attention 'linear' is not available for MLA models; use 'native' or 'mla'")
    per_layer = 2 * model.num_kv_heads * (model.head_dim * elem + scale)  # every token's K/V, as native
    feature = strategy.linear_feature_dim or model.head_dim
    summary = model.num_kv_heads * feature * (model.head_dim + 1) * LINEAR_STATE_BYTES  # [Hkv, m, Dv + 1]
    return KVFootprint(  # a hybrid model's own linear layers keep their state
        bytes_per_token=model.num_full_layers * per_layer,
        fixed_bytes_per_sequence=model.num_full_layers * summary + model.num_linear_layers * _lightning_state_bytes(model),
    )


def _lightning_state_bytes(model: ModelShape) -> int:
    """A hybrid model's linear layer (MiniMax lightning): phi(K)^T V per head, and a normaliser (conservative)."""
    state = model.num_attention_heads * model.head_dim * model.head_dim
    normaliser = model.num_attention_heads * model.head_dim
    return (state + normaliser) * LINEAR_STATE_BYTES


def _round_up(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size) * block_size


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
