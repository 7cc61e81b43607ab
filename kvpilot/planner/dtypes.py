"""Byte widths of weight and KV-cache dtypes."""

from __future__ import annotations

from kvpilot.planner.errors import PlannerError

KV_CACHE_DTYPES = ("auto", "bf16", "fp16", "int8", "fp8")

# Quantised KV stores one scale per (token, KV head) for K and for V: fp32 by default.
QUANTISED_KV_DTYPES = frozenset({"int8", "fp8"})
DEFAULT_SCALE_BYTES = 4

_KV_BYTES = {"bf16": 2, "fp16": 2, "int8": 1, "fp8": 1}

_WEIGHT_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "int8": 1, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    """Bytes per cached element. `auto` plans with the model's own precision (its widest case)."""
    if kv_cache_dtype == "auto":
        return model_dtype_bytes
    try:
        return _KV_BYTES[kv_cache_dtype]
    except KeyError:
        raise PlannerError(
            f"kv_cache_dtype {kv_cache_dtype!r} is not supported; choose one of {', '.join(KV_CACHE_DTYPES)}"
        ) from None


def weight_dtype_bytes(name: str | None) -> int:
    """Bytes per weight for an HF `torch_dtype`/`dtype` string (bf16 when the config names none)."""
    if name is None:
        return 2
    key = str(name).removeprefix("torch.").lower()
    try:
        return _WEIGHT_BYTES[key]
    except KeyError:
        raise PlannerError(
            f"model dtype {name!r} is not known; expected one of {', '.join(sorted(_WEIGHT_BYTES))}"
        ) from None
