"""KV-cache dtype and GQA-conversion settings of an EngineConfig: validation, resolution, naming.

Torch-free (the server's CLI and capacity plan import it). `kv_cache_dtype` values:

- `auto`: the model's compute dtype, as before; with `kv_quant_auto_threshold` set, new sequences
  switch between a 16-bit pool and an int8 pool by running batch size (see strategies/kv_quant/pools.py).
- `bfloat16`/`bf16`, `float16`/`fp16`, `float32`: a 16/32-bit cache of that dtype.
- `int8` (symmetric, per token and KV head scales), `fp8` (e4m3, per KV head scales): 8-bit caches
  dequantised inside the attention kernels (kernels/kv_quant).

`disable_kv_quant` turns int8/fp8/auto-switching into the model-dtype cache; `disable_gqa` serves
the checkpoint's own KV heads. Each changes nothing else.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from kvpilot.engine.config.model import ModelConfig
from kvpilot.strategy_schema import ATTENTIONS as ATTENTIONS
from kvpilot.strategy_schema import AUTO_QUANT_DTYPE as AUTO_QUANT_DTYPE
from kvpilot.strategy_schema import (
    CALIBRATED_ROPE_PAIRS,
    canonical_kv_dtype,
    linear_window_stays_resident,
    short_dtype,
)
from kvpilot.strategy_schema import EIGHT_BIT_KV_DTYPES as QUANTISED
from kvpilot.strategy_schema import ENGINE_KV_CACHE_DTYPES as KV_CACHE_DTYPES
from kvpilot.strategy_schema import EVICTION_MODES as EVICTION_MODES
from kvpilot.strategy_schema import MLA_ROPE_PAIRS as MLA_ROPE_PAIRS


class EngineConfig(Protocol):
    """The EngineConfig fields these checks read (config/engine.py imports this module, not back)."""

    kv_cache_dtype: str
    kv_quant_auto_threshold: int | None
    kv_quant_auto_hysteresis: int | None
    kv_quant_auto_split: float
    fallback_reserve: float
    disable_kv_quant: bool
    attention: str
    kv_head_groups: int | None
    disable_gqa: bool
    latent_rank: int | None
    mla_rope_dims: int | None
    mla_rope_pairs: str
    disable_mla: bool
    disable_linear: bool
    linear_window: int
    enable_chunked_prefill: bool
    block_size: int
    eviction: str
    eviction_sinks: int
    eviction_window: int
    eviction_ladder_span: int | None
    validate_every: int
    validation_sample_rate: float
    validation_threshold: float
    head_utilization_every: int
    tensor_parallel_size: int

# The vocabulary (ATTENTIONS, KV_CACHE_DTYPES, QUANTISED, EVICTION_MODES, MLA_ROPE_PAIRS, AUTO_QUANT_DTYPE)
# is kvpilot/strategy_schema.py's, shared with the planner and the operator; re-exported here.
GQA_FAMILIES = ("llama", "mistral", "qwen2")  # k_proj/v_proj per layer, HF repeat_kv grouping


def check_kv_strategy(config: EngineConfig) -> None:
    """Raise ValueError for KV-dtype / attention settings the engine cannot serve."""
    if config.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype {config.kv_cache_dtype!r} is not supported; choose one of {', '.join(KV_CACHE_DTYPES)}"
        )
    threshold = config.kv_quant_auto_threshold
    if threshold is not None:
        if threshold < 1:
            raise ValueError(f"kv_quant_auto_threshold must be >= 1 or None (never switch), got {threshold}")
        if config.kv_cache_dtype != "auto":
            raise ValueError(
                f"kv_quant_auto_threshold applies to kv_cache_dtype='auto' only, not {config.kv_cache_dtype!r}"
            )
    hysteresis = config.kv_quant_auto_hysteresis
    if hysteresis is not None and hysteresis < 0:
        raise ValueError(f"kv_quant_auto_hysteresis must be >= 0 or None (threshold // 4), got {hysteresis}")
    if not 0.0 < config.kv_quant_auto_split < 1.0:
        raise ValueError(
            f"kv_quant_auto_split (share of KV memory for the 16-bit pool) must be in (0, 1), "
            f"got {config.kv_quant_auto_split}"
        )
    if not 0.0 <= config.fallback_reserve < 1.0:
        raise ValueError(
            f"fallback_reserve (share of KV memory kept as exact-path blocks) must be in [0, 1), "
            f"got {config.fallback_reserve}"
        )
    if config.attention not in ATTENTIONS:
        raise ValueError(f"attention {config.attention!r} is not supported; choose one of {', '.join(ATTENTIONS)}")
    if config.attention == "gqa" and (config.kv_head_groups is None or config.kv_head_groups < 1):
        raise ValueError(
            f"attention='gqa' needs kv_head_groups >= 1 (KV heads after merging), got {config.kv_head_groups}"
        )


SIXTEEN_BIT_KINDS = ("model", "float32", "float16", "bfloat16")  # kv_cache_kind values of a 16/32-bit cache


def kv_cache_kind(config: EngineConfig) -> str:
    """The cache the engine allocates: 'model' (compute dtype), 'float32'/'float16'/'bfloat16',
    'int8', 'fp8', or 'auto-switch' (16-bit and int8 pools)."""
    name = canonical_kv_dtype(config.kv_cache_dtype)
    if config.disable_kv_quant and (name in QUANTISED or name == "auto"):
        return "model"
    if name == "auto":
        return "auto-switch" if config.kv_quant_auto_threshold is not None else "model"
    return name


def auto_hysteresis(config: EngineConfig) -> int:
    """Running sequences below the threshold before new sequences go back to 16-bit blocks."""
    if config.kv_quant_auto_hysteresis is not None:
        return config.kv_quant_auto_hysteresis
    return max(1, (config.kv_quant_auto_threshold or 0) // 4)


def gqa_groups(config: EngineConfig) -> int | None:
    """KV heads after conversion, or None when the checkpoint's heads are served."""
    if config.attention != "gqa" or config.disable_gqa:
        return None
    return config.kv_head_groups


def served_model_config(config: EngineConfig, model_config: ModelConfig) -> ModelConfig:
    """The architecture the engine runs: num_key_value_heads = kv_head_groups under GQA conversion."""
    groups = gqa_groups(config)
    if groups is not None and groups == model_config.num_key_value_heads and config.conversion_calibration:
        raise ValueError(
            f"conversion_calibration has nothing to calibrate: kv_head_groups {groups} equals the checkpoint's "
            f"{groups} KV heads, so no heads are merged; choose fewer kv_head_groups or drop conversion_calibration"
        )
    if groups is None or groups == model_config.num_key_value_heads:
        return model_config
    if model_config.family not in GQA_FAMILIES:
        raise ValueError(
            f"attention='gqa' converts {', '.join(GQA_FAMILIES)} checkpoints, not {model_config.family!r}; "
            "pass --disable-gqa to serve it as it is"
        )
    heads = model_config.num_key_value_heads
    if heads % groups:
        raise ValueError(
            f"kv_head_groups={groups} must divide the checkpoint's num_key_value_heads={heads}; "
            f"choose one of {[g for g in range(1, heads + 1) if heads % g == 0]}"
        )
    return replace(model_config, num_key_value_heads=groups)


def strategy_label(config: EngineConfig, model_dtype: str) -> str:
    """X-Model-Strategy default: attention (with its parameter) and KV dtype, e.g. `gqa4-int8`, `mla64rope16-bf16`,
    `native-bf16`, `native-auto8` (16-bit/int8 switching). model_dtype: the cache dtype 'model' means."""
    attention = config.attention
    rope = getattr(config, "mla_rope_dims", None)  # partial RoPE is another model: e.g. mla64rope16-bf16
    param = {
        "gqa": gqa_groups(config),
        "mla": None if config.latent_rank is None else f"{config.latent_rank}" + ("" if rope is None else f"rope{rope}"),
        "linear": config.linear_window,
    }
    if getattr(config, f"disable_{attention}", False):
        attention = "native"  # the one-flag rollback serves the checkpoint's own attention
    elif attention in param:
        attention = f"{attention}{param[attention] or ''}"
    kind = kv_cache_kind(config)
    if kind == "model":
        kv = short_dtype(model_dtype)
    elif kind == "auto-switch":
        kv = f"auto{config.kv_quant_auto_threshold}"
    else:
        kv = short_dtype(kind)
    eviction = config.eviction  # e.g. native-bf16-sinks1024
    return f"{attention}-{kv}" + ("" if eviction == "none" else f"-{eviction}{config.eviction_window}")


def check_eviction_tokens(sinks: int, window: int, span: int | None) -> None:
    """Raise unless the eviction token counts are usable: sinks >= 0, window >= 1, span >= 1 or None."""
    if sinks < 0 or window < 1 or (span is not None and span < 1):
        raise ValueError(
            f"eviction_sinks must be >= 0, eviction_window >= 1 and eviction_ladder_span >= 1 tokens; "
            f"got {sinks}, {window}, {span}"
        )


def check_eviction_config(config: EngineConfig) -> None:
    """Raise ValueError naming the bad eviction / validation field and what is allowed."""
    if config.eviction not in EVICTION_MODES:
        raise ValueError(f"eviction must be one of {EVICTION_MODES}, got {config.eviction!r}")
    check_eviction_tokens(config.eviction_sinks, config.eviction_window, config.eviction_ladder_span)
    if config.eviction != "none" and not config.enable_chunked_prefill:
        raise ValueError("eviction needs chunked prefill (long prompts are evicted between chunks); enable it")
    if config.validate_every < 1:
        raise ValueError(f"validate_every must be >= 1 decode tokens, got {config.validate_every}")
    if not 0.0 <= config.validation_sample_rate <= 1.0:
        raise ValueError(f"validation_sample_rate must be in [0, 1], got {config.validation_sample_rate}")
    if not -1.0 <= config.validation_threshold <= 1.0:
        raise ValueError(f"validation_threshold must be a cosine in [-1, 1], got {config.validation_threshold}")
    if config.head_utilization_every < 0:
        raise ValueError(f"head_utilization_every must be >= 0 (0: off), got {config.head_utilization_every}")


def check_linear_strategy(config: EngineConfig) -> None:
    """attention='linear' (unless disabled) reads its exact window from a 16/32-bit cache, and
    eviction may only drop the oldest blocks while keeping that window resident."""
    if config.attention != "linear" or config.disable_linear:
        return
    if kv_cache_kind(config) not in SIXTEEN_BIT_KINDS:
        raise ValueError(
            f"attention='linear' reads its exact window from a 16/32-bit KV cache, not kv_cache_dtype="
            f"{config.kv_cache_dtype!r}; choose a 16-bit kv_cache_dtype or pass --disable-kv-quant"
        )
    check_eviction_fits(config)


def check_eviction_fits(config: EngineConfig) -> None:
    """The Performer window reads the newest tokens by position in the sequence's view, so eviction
    may only drop the oldest blocks (sinks, no sink tokens) and must keep at least the window."""
    mode = config.eviction
    if not linear_window_stays_resident(mode, config.eviction_sinks, config.eviction_window, config.block_size,
                                        config.linear_window):
        raise ValueError(
            f"attention='linear' with eviction needs eviction='sinks', eviction_sinks=0 and eviction_window >= "
            f"linear_window - 1 ({config.linear_window - 1}) so the exact window stays resident; got eviction="
            f"{mode!r}, eviction_sinks={config.eviction_sinks}, eviction_window={config.eviction_window} "
            "(or use eviction='none')"
        )


def conversion_rank(config: EngineConfig, model_config: ModelConfig) -> int | None:
    """The latent rank to convert to, or None (native model, another strategy, or --disable-mla)."""
    attention = config.attention
    if model_config.deepseek is not None:
        if config.latent_rank is not None:
            raise ValueError(
                f"latent_rank={config.latent_rank}: {model_config.family} already caches an MLA latent of "
                f"kv_lora_rank={model_config.deepseek.kv_lora_rank}; leave latent_rank unset"
            )
        return None
    if attention != "mla":
        if config.latent_rank is not None:
            raise ValueError(f"latent_rank applies to attention='mla' only, not {attention!r}")
        return None
    if config.disable_mla:
        return None
    if config.latent_rank is None:
        raise ValueError(
            f"attention='mla' on a {model_config.family} checkpoint needs latent_rank (the shared latent's width)"
        )
    if config.eviction != "none":
        raise ValueError(
            "eviction is not available with the MLA conversion: its keys are rotated at attention time by "
            "their position in the cached view, which eviction shortens; use eviction='none' or --disable-mla"
        )
    return config.latent_rank


def check_mla_rope(config: EngineConfig) -> None:
    """mla_rope_dims (partial-RoPE MLA conversion): even and >= 0, for attention='mla' only; `norm` pairs
    need calibration text. Its bound by head_dim is checked with the checkpoint (check_model_strategy)."""
    dims = config.mla_rope_dims
    if config.mla_rope_pairs not in MLA_ROPE_PAIRS:
        raise ValueError(f"mla_rope_pairs {config.mla_rope_pairs!r} is not a rule; choose one of {', '.join(MLA_ROPE_PAIRS)}")
    if dims is None:
        return
    if config.attention != "mla":
        raise ValueError(f"mla_rope_dims applies to attention='mla' only, not {config.attention!r}")
    if dims < 0 or dims % 2:
        raise ValueError(
            f"mla_rope_dims={dims} must be an even number >= 0 (RoPE rotates dims in pairs), or unset for RoPE on "
            "every dim"
        )
    if config.mla_rope_pairs in CALIBRATED_ROPE_PAIRS and config.conversion_calibration is None:
        raise ValueError(
            f"mla_rope_pairs={config.mla_rope_pairs!r} scores pairs on calibration text: set conversion_calibration"
        )


def check_mla_rope_model(config: EngineConfig, model_config: ModelConfig) -> None:
    """mla_rope_dims <= head_dim; DeepSeek checkpoints have their own RoPE split and refuse it."""
    dims = config.mla_rope_dims
    if dims is None or config.disable_mla:
        return
    if model_config.deepseek is not None:
        raise ValueError(
            f"mla_rope_dims={dims}: {model_config.family} already has its own RoPE split "
            f"(qk_rope_head_dim={model_config.deepseek.qk_rope_head_dim}); leave mla_rope_dims unset"
        )
    if dims > model_config.head_dim:
        raise ValueError(
            f"mla_rope_dims={dims} exceeds head_dim={model_config.head_dim}; choose an even number in 0..{model_config.head_dim}"
        )


TP_FAMILIES = GQA_FAMILIES  # the Llama-architecture decoders have tensor-parallel layers


def check_tensor_parallel(config: EngineConfig) -> None:
    """tensor_parallel_size >= 1; under TP the strategies that keep per-layer state outside the paged
    K/V heads (the MLA latent, the Performer conversion) are refused: they are not sharded yet."""
    tp = config.tensor_parallel_size
    if tp < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1 (1: no tensor parallelism), got {tp}")
    if tp == 1:
        return
    if gqa_groups(config) is not None and getattr(config, "conversion_calibration", None) is not None:
        raise ValueError(
            f"conversion_calibration with attention='gqa' regroups the heads on one device; it is not available "
            f"with tensor_parallel_size={tp}: drop conversion_calibration (index grouping works under TP) or use "
            "tensor_parallel_size=1"
        )
    for attention in ("mla", "linear"):
        if config.attention == attention and not getattr(config, f"disable_{attention}"):
            raise ValueError(
                f"attention={attention!r} is not available with tensor_parallel_size={tp}: its "
                f"{'latent cache' if attention == 'mla' else 'linear-attention conversion'} is not sharded over "
                "ranks; use attention native or gqa (with native, gqa, int8/fp8 KV and eviction TP works), "
                f"pass --disable-{attention}, or tensor_parallel_size=1"
            )


def check_tensor_parallel_model(config: EngineConfig, model_config: ModelConfig) -> None:
    """The checkpoint splits over the ranks: a Llama-architecture family, query heads, served KV heads
    (split, or copied when fewer than ranks) and the MLP width divisible."""
    tp = config.tensor_parallel_size
    if tp == 1:
        return
    if model_config.family not in TP_FAMILIES:
        raise ValueError(
            f"tensor_parallel_size={tp} serves {', '.join(TP_FAMILIES)} checkpoints, not {model_config.family!r} "
            "(MLA and hybrid linear-attention models are not sharded yet); use tensor_parallel_size=1"
        )
    served = served_model_config(config, model_config)
    heads, kv_heads = served.num_attention_heads, served.num_key_value_heads
    if heads % tp or (kv_heads % tp and tp % kv_heads):
        raise ValueError(
            f"tensor_parallel_size={tp} must divide num_attention_heads={heads}, and it and the served "
            f"num_key_value_heads={kv_heads} must divide one another (KV heads are split over ranks, or copied "
            f"when fewer); sizes that work: {[n for n in range(1, heads + 1) if not heads % n and not (kv_heads % n and n % kv_heads)]}"
        )
    if model_config.intermediate_size % tp:
        raise ValueError(
            f"tensor_parallel_size={tp} must divide intermediate_size={model_config.intermediate_size} (the MLP is split "
            "over ranks)"
        )


def check_model_strategy(config: EngineConfig, model_config: ModelConfig) -> None:
    """The checks that need the checkpoint's architecture; the runner calls this before any weight loads.
    The MLA latent cache is 16/32-bit: the 8-bit K/V formats (kernels/kv_quant) have no latent variant."""
    check_tensor_parallel_model(config, model_config)
    check_mla_rope_model(config, model_config)
    kind = kv_cache_kind(config)
    mla = model_config.deepseek is not None or conversion_rank(config, model_config) is not None
    if mla and (kind in QUANTISED or kind == "auto-switch"):
        raise ValueError(
            f"kv_cache_dtype {config.kv_cache_dtype!r} ({kind}) is not available for an MLA latent cache; "
            "use auto, float16, bfloat16 or float32, or pass --disable-kv-quant"
        )
