"""The memory-strategy vocabulary, once: the engine's config, the planner, the operator and the CRD use it.

Standard library only (the operator's image has no torch; the engine's config loads before torch). It holds
the strategy names, the KV cache dtypes (canonical name, aliases, bytes per element, 8-bit or not), the
fields of spec.strategy (type, range, default) and the `kvpilot serve` flag and EngineConfig field each one
becomes. tests/unit/test_strategy_schema.py holds the CRD's enums, the serve parser and the planner to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ATTENTIONS = ("native", "gqa", "mla", "linear")
CALIBRATED_ATTENTIONS = ("gqa", "mla")  # the conversions calibration text fits
EVICTION_MODES = ("none", "sinks", "ladder")
MLA_ROPE_PAIRS = ("auto", "high", "norm", "turn")  # the engine's rules: strategies/mla/rope_select.py
CALIBRATED_ROPE_PAIRS = ("norm", "turn")  # the rules that score RoPE pairs on calibration text
BLOCK_SIZES = (8, 16, 32, 64, 128)  # spec.strategy.blockSize (the engine takes any power of two)
ROLLBACK_SWITCHES = ("gqa", "mla", "linear", "kv-quant")  # spec.engine.disable: --disable-<name>


@dataclass(frozen=True)
class KVDtype:
    """One kv_cache_dtype: the engine's canonical name, its other spellings and bytes per cached element."""

    name: str  # the engine's (torch's) name
    short: str  # labels (X-Model-Strategy) and, when in_spec, spec.strategy.kvCacheDtype and the planner
    bytes: int | None  # per element; None: auto, the model's own dtype
    aliases: tuple[str, ...] = ()  # other spellings `kvpilot serve --kv-cache-dtype` accepts
    eight_bit: bool = False  # dequantised inside the attention kernels, with scales (kernels/kv_quant)
    token_scales: bool = False  # an fp32 scale per token, layer and K or V head beside the elements (else per layer)
    in_spec: bool = True  # offered by spec.strategy.kvCacheDtype and the planner


KV_DTYPES = (
    KVDtype("auto", "auto", None),
    KVDtype("bfloat16", "bf16", 2, ("bf16",)),
    KVDtype("float16", "fp16", 2, ("fp16",)),
    KVDtype("float32", "fp32", 4, in_spec=False),
    KVDtype("int8", "int8", 1, eight_bit=True, token_scales=True),  # symmetric, per token and KV head scales
    KVDtype("fp8", "fp8", 1, eight_bit=True),  # e4m3, per layer and KV head scales (calibrated at the first store)
)
ENGINE_KV_CACHE_DTYPES = tuple(n for d in KV_DTYPES for n in (d.name, *d.aliases))  # EngineConfig.kv_cache_dtype
SPEC_KV_CACHE_DTYPES = tuple(d.short for d in KV_DTYPES if d.in_spec)  # spec.strategy.kvCacheDtype, the planner
EIGHT_BIT_KV_DTYPES = tuple(d.name for d in KV_DTYPES if d.eight_bit)
AUTO_QUANT_DTYPE = "int8"  # the 8-bit pool of kv_cache_dtype=auto (per-token scales: no calibration)
KV_SCALE_BYTES = 4  # a token_scales cache's fp32 scale per token, layer and cached K or V head

# Bytes per element of every dtype spelling a checkpoint's config.json may name (torch_dtype / dtype)
DTYPE_BYTES: dict[str, int] = {
    **{n: d.bytes for d in KV_DTYPES if d.bytes for n in (d.name, d.short, *d.aliases)},
    "float": 4, "half": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip


def kv_dtype(name: str) -> KVDtype:
    """The KV dtype named `name` (canonical, alias or short), or ValueError naming the choices."""
    for d in KV_DTYPES:
        if name in (d.name, d.short, *d.aliases):
            return d
    raise ValueError(f"kv_cache_dtype {name!r} is not supported; choose one of {', '.join(ENGINE_KV_CACHE_DTYPES)}")


def canonical_kv_dtype(name: str) -> str:
    """The engine's name for a KV dtype spelling (bf16 -> bfloat16); an unknown name comes back as it is."""
    return next((d.name for d in KV_DTYPES if name in (d.name, *d.aliases)), name)


def short_dtype(name: str) -> str:
    """The label spelling of a canonical dtype name (bfloat16 -> bf16); any other name comes back as it is."""
    return next((d.short for d in KV_DTYPES if name == d.name), name)


def spec_kv_dtype_flag(spec_name: str) -> str:
    """spec.strategy.kvCacheDtype -> the `--kv-cache-dtype` value (torch's names for 16-bit: bf16 -> bfloat16)."""
    if spec_name not in SPEC_KV_CACHE_DTYPES:
        raise ValueError(
            f"strategy.kvCacheDtype {spec_name!r} is not supported; choose one of {', '.join(SPEC_KV_CACHE_DTYPES)}"
        )
    return canonical_kv_dtype(spec_name)


@dataclass(frozen=True)
class StrategyField:
    """One field of spec.strategy: its CRD key, type, range and default, and the serve flag it becomes."""

    name: str  # StrategySpec's (and KVStrategy's) field
    crd: str  # the key in spec.strategy / spec.canary.strategy
    type: type  # int, float, str, or dict (an object)
    default: Any = None  # the value when unset (None: no value)
    crd_default: bool = True  # the CRD writes the default into stored objects (False: the operator's only)
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None
    engine_field: str | None = None  # the EngineConfig field the flag sets (None: no flag)

    @property
    def flag(self) -> str | None:
        """The `kvpilot serve` flag (config/arguments.py derives --field-name from EngineConfig's field)."""
        return None if self.engine_field is None else "--" + self.engine_field.replace("_", "-")


STRATEGY_FIELDS = (
    StrategyField("attention", "attention", str, "native", choices=ATTENTIONS, engine_field="attention"),
    StrategyField("kv_head_groups", "kvHeadGroups", int, minimum=1, maximum=256, engine_field="kv_head_groups"),
    StrategyField("latent_rank", "latentRank", int, minimum=1, maximum=65536, engine_field="latent_rank"),
    StrategyField("mla_rope_dims", "mlaRopeDims", int, minimum=2, maximum=1024, engine_field="mla_rope_dims"),
    # No CRD default: it would enter every stored strategy and change the digest a promotion is keyed to
    StrategyField("mla_rope_pairs", "mlaRopePairs", str, "auto", crd_default=False, choices=MLA_ROPE_PAIRS,
                  engine_field="mla_rope_pairs"),
    StrategyField("calibration", "calibration", dict, engine_field="conversion_calibration"),  # a mounted file
    StrategyField("linear_window", "linearWindow", int, 64, minimum=0, maximum=65536, engine_field="linear_window"),
    StrategyField("kv_cache_dtype", "kvCacheDtype", str, "auto", choices=SPEC_KV_CACHE_DTYPES,
                  engine_field="kv_cache_dtype"),  # the value through spec_kv_dtype_flag
    StrategyField("kv_quant_auto_threshold", "kvQuantAutoThreshold", int, minimum=1, maximum=65536,
                  engine_field="kv_quant_auto_threshold"),
    StrategyField("kv_quant_auto_split", "kvQuantAutoSplit", float, 0.5, minimum=0.05, maximum=0.95,
                  engine_field="kv_quant_auto_split"),
    StrategyField("fallback_reserve", "fallbackReserve", float, 0.1, minimum=0, maximum=0.9,
                  engine_field="fallback_reserve"),
    StrategyField("max_seq_len", "maxSeqLen", int, 4096, minimum=16, maximum=1048576, engine_field="max_model_len"),
    StrategyField("block_size", "blockSize", int, 16, choices=BLOCK_SIZES, engine_field="block_size"),
    StrategyField("eviction", "eviction", str, "none", choices=EVICTION_MODES, engine_field="eviction"),
    # No CRD defaults: new keys in every stored strategy would change the digest a promotion is keyed to
    StrategyField("eviction_sinks", "evictionSinks", int, 4, crd_default=False, minimum=0, maximum=65536,
                  engine_field="eviction_sinks"),
    StrategyField("eviction_window", "evictionWindow", int, 1024, crd_default=False, minimum=1, maximum=1048576,
                  engine_field="eviction_window"),
    StrategyField("eviction_ladder_span", "evictionLadderSpan", int, crd_default=False, minimum=1, maximum=1048576,
                  engine_field="eviction_ladder_span"),
    StrategyField("max_num_batched_tokens", "maxNumBatchedTokens", int, 8192, minimum=256, maximum=1048576,
                  engine_field="max_num_batched_tokens"),
)
CALIBRATION_FIELDS = (  # spec.strategy.calibration: a ConfigMap key the engine reads as a file
    StrategyField("config_map", "configMap", str),
    StrategyField("key", "key", str, "calibration.txt"),
    StrategyField("tokens", "tokens", int, 2048, minimum=16, maximum=65536, engine_field="calibration_tokens"),
)
FIELDS = {f.name: f for f in STRATEGY_FIELDS}
CRD_KEYS = {f.crd: f.name for f in STRATEGY_FIELDS}  # spec.strategy key -> field name
CALIBRATION = {f.name: f for f in CALIBRATION_FIELDS}


def linear_window_stays_resident(eviction: str, sinks: int, window: int, block_size: int, linear_window: int) -> bool:
    """Whether eviction keeps the Performer conversion's exact window (read by position in the sequence's view):
    no eviction, or sinks eviction of the oldest blocks only (no sink tokens) keeping >= linear_window - 1 tokens."""
    if eviction == "none":
        return True
    kept = -(-window // block_size) * block_size
    return eviction == "sinks" and sinks == 0 and kept >= linear_window - 1


SLIDING_WINDOW_FAMILIES = ("llama", "mistral")  # every layer slides; Qwen2's per-layer split is not modelled


def configured_window(config: Mapping[str, Any]) -> int | None:
    """A config.json's sliding window in tokens, or None (absent, null, or `use_sliding_window: false`)."""
    window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
    return window if isinstance(window, int) and window > 0 else None


def sliding_window_gap(family: str, window: int, attention: str, kv_cache: str, sixteen_bit: bool, eviction: str,
                       sinks: int, eviction_window: int, block_size: int) -> str:
    """Why the engine cannot apply a model's sliding window of `window` tokens ('' when it can, or for 0).

    The engine (engine/config/sliding_window.py) keeps max_model_len within the window then, and refuses
    a longer one; the operator's preflight refuses such a maxSeqLen before any pod. `attention` is the
    served one ('native' for a strategy's one-flag rollback), `kv_cache` names the cache for the message."""
    if not window:
        return ""
    if family not in SLIDING_WINDOW_FAMILIES:
        return f"the {family} family's sliding window is not implemented"
    if attention != "native":
        return f"attention {attention!r} attends over the whole context"
    if not sixteen_bit:
        return f"the {kv_cache} KV cache's kernels attend over the whole context"
    # the kernels count the window in the sequence's resident view: positions while eviction drops only the
    # oldest blocks (no sinks) and keeps the window's window - 1 earlier tokens
    if not linear_window_stays_resident(eviction, sinks, eviction_window, block_size, window):
        return (f"eviction {eviction!r} ({sinks} sinks, window {eviction_window}) leaves gaps in the view the "
                f"window is counted in; sinks eviction with 0 sinks and a window of >= {window - 1} tokens keeps it")
    return ""


def default(name: str) -> Any:
    """The default of spec.strategy's field `name` (snake_case)."""
    return FIELDS[name].default


def flag(name: str) -> str:
    """The `kvpilot serve` flag of spec.strategy's field `name` (snake_case), or of calibration's `tokens`."""
    field = FIELDS.get(name) or CALIBRATION.get(name)
    if field is None or field.flag is None:
        raise KeyError(f"spec.strategy field {name!r} has no kvpilot serve flag")
    return field.flag


def rollback_flag(switch: str) -> str:
    """spec.engine.disable entry (one of ROLLBACK_SWITCHES, the CRD's enum) -> `kvpilot serve --disable-<switch>`
    (EngineConfig.disable_<switch>, dashes as underscores)."""
    return f"--disable-{switch}"
