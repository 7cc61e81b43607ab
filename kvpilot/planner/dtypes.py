"""Byte widths of weight and KV-cache dtypes (the names and bytes are kvpilot/strategy_schema.py's)."""

from __future__ import annotations

from kvpilot.planner.errors import PlannerError
from kvpilot.strategy_schema import DTYPE_BYTES, kv_dtype
from kvpilot.strategy_schema import SPEC_KV_CACHE_DTYPES as KV_CACHE_DTYPES


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    """Bytes per cached element. `auto` plans with the model's own precision (its widest case)."""
    if kv_cache_dtype == "auto":
        return model_dtype_bytes
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise PlannerError(
            f"kv_cache_dtype {kv_cache_dtype!r} is not supported; choose one of {', '.join(KV_CACHE_DTYPES)}"
        )
    size = kv_dtype(kv_cache_dtype).bytes
    assert size is not None  # only auto has none
    return size


def weight_dtype_bytes(name: str | None) -> int:
    """Bytes per weight for an HF `torch_dtype`/`dtype` string (bf16 when the config names none)."""
    if name is None:
        return 2
    key = str(name).removeprefix("torch.").lower()
    try:
        return DTYPE_BYTES[key]
    except KeyError:
        raise PlannerError(
            f"model dtype {name!r} is not known; expected one of {', '.join(sorted(DTYPE_BYTES))}"
        ) from None
