"""The capacity plan `kvpilot serve` prints at start and sizes its KV pool from (kvpilot.planner).

On a GPU the plan uses the device's total memory; on CPU a configured memory budget stands in
for it (there is no CUDA context there). The plan counts what the engine will hold: its weights,
activations and `auto` KV in the compute dtype (config/engine.compute_dtype: float32 on CPU, so a bf16
checkpoint takes twice its files' size there), the weights' element counts read from the safetensors
headers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from kvpilot.engine.config.engine import compute_dtype
from kvpilot.engine.config.strategy import gqa_groups, kv_cache_kind, strategy_label
from kvpilot.planner import CapacityPlan, GpuSpec, KVStrategy, ModelShape, plan_capacity
from kvpilot.strategy_schema import DTYPE_BYTES

# EngineConfig dtype names -> the planner's KV dtype names ("auto" = the model's own precision).
_PLANNER_KV_DTYPE = {"auto": "auto", "float32": "auto", "float16": "fp16", "bfloat16": "bf16"}


def resolve_device(device: str) -> str:
    """`auto` -> `cuda` when a GPU is visible, else `cpu`; `cuda:N` stays as it is."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def model_dtype(model_dir: str) -> str:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return str(config.get("torch_dtype") or config.get("dtype") or "float32").removeprefix("torch.")


def strategy_name(config: Any) -> str:
    """The default X-Model-Strategy: attention strategy and KV dtype, e.g. `native-bf16`, `gqa4-int8`."""
    dtype = config.dtype if config.dtype != "auto" else model_dtype(config.model)
    return strategy_label(config, dtype)


# safetensors dtype codes: floating tensors load in the compute dtype, the others as stored
_FLOAT_CODES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
_STORED_BYTES = {"I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_MAX_HEADER = 100 * 2**20  # the safetensors format's own limit


def loaded_weight_bytes(model_dir: str | Path, compute_bytes: int) -> int | None:
    """Bytes the checkpoint's tensors take once loaded (floating ones at `compute_bytes` each), from the
    safetensors headers alone; None when the directory has no safetensors file (dummy weights)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    total = 0
    for path in files:
        with path.open("rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            if not 0 < size <= _MAX_HEADER:
                raise ValueError(f"{path} is not a safetensors file (header length {size})")
            try:
                header = json.loads(fh.read(size))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{path} is not a safetensors file: its header is not JSON ({exc})") from exc
        for name, tensor in header.items():
            if name == "__metadata__":
                continue
            code, numel = tensor["dtype"], math.prod(tensor["shape"])
            if code not in _FLOAT_CODES and code not in _STORED_BYTES:
                raise ValueError(f"{path}: tensor {name!r} has dtype {code!r}, which the engine does not load")
            total += numel * (compute_bytes if code in _FLOAT_CODES else _STORED_BYTES[code])
    return total if files else None


def device_memory(device: str, cpu_budget_bytes: int) -> GpuSpec:
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return GpuSpec(product=props.name.replace(" ", "-"), memory_bytes=int(props.total_memory))
    return GpuSpec(product="cpu-budget", memory_bytes=cpu_budget_bytes, cuda_context_bytes=0)


def cached_latent_width(config: Any, raw: dict[str, Any]) -> int | None:
    """The MLA conversion's cached row width: latent_rank, plus mla_rope_dims per KV head under partial RoPE
    (those dims are cached exactly beside the latent, strategies/mla/partial.py)."""
    rank, rope = getattr(config, "latent_rank", None), getattr(config, "mla_rope_dims", None)
    if rank is None or not rope:
        return rank
    return rank + rope * int(raw.get("num_key_value_heads") or raw["num_attention_heads"])


def plan_for(config: Any, device: str, cpu_budget_bytes: int, watermark: float) -> CapacityPlan:
    raw = json.loads((Path(config.model) / "config.json").read_text())
    max_seq_len = config.max_model_len or int(raw.get("max_position_embeddings") or 4096)
    kind = kv_cache_kind(config)  # auto switching: the planner models the 16-bit and int8 pools
    kv_dtype = {"model": config.dtype, "auto-switch": "auto"}.get(kind, kind)
    groups = gqa_groups(config)
    attention = config.attention if config.attention != "gqa" else "gqa" if groups else "native"
    if attention == "linear" and getattr(config, "disable_linear", False):
        attention = "native"  # --disable-linear: the checkpoint's softmax attention
    if attention == "mla" and getattr(config, "disable_mla", False):
        attention = "native"  # --disable-mla: the checkpoint's own K/V
    strategy = KVStrategy(
        attention=attention,
        kv_head_groups=groups,
        latent_rank=cached_latent_width(config, raw) if attention == "mla" else None,
        kv_cache_dtype=_PLANNER_KV_DTYPE.get(kv_dtype, kv_dtype),
        block_size=config.block_size,
        fallback_reserve=getattr(config, "fallback_reserve", 0.0),  # the engine's reserve (planner/pools.py)
        kv_quant_auto_threshold=config.kv_quant_auto_threshold if kind == "auto-switch" else None,
        kv_quant_auto_split=getattr(config, "kv_quant_auto_split", 0.5),
        calibrated=getattr(config, "conversion_calibration", None) is not None,
        linear_feature_dim=getattr(config, "linear_features", None),
        eviction=config.eviction, eviction_sinks=config.eviction_sinks, eviction_window=config.eviction_window,
        eviction_ladder_span=config.eviction_ladder_span,
    )
    compute = DTYPE_BYTES[compute_dtype(config.dtype, model_dtype(config.model), device.split(":")[0])]
    # the engine's parameters and activations are in the compute dtype, whatever the checkpoint stores
    shape = dataclasses.replace(ModelShape.from_hf_config(raw), dtype_bytes=compute, weight_dtype_bytes=None)
    return plan_capacity(
        shape,
        strategy,
        device_memory(device, cpu_budget_bytes),
        max_seq_len=max_seq_len,
        gpus=getattr(config, "tensor_parallel_size", 1),  # each rank has the device's (or the CPU budget's) memory
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        watermark=watermark,
        weights_bytes_override=loaded_weight_bytes(config.model, compute),
    )


_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_UNITS.update({"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40})


def parse_bytes(text: str) -> int:
    """`512MiB`, `2GiB`, `1.5G`, `1048576` -> bytes."""
    match = _BYTES_RE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a byte size; write e.g. 268435456, 256MiB or 2GiB")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])
