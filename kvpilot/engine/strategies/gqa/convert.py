"""GQA conversion: merge an MHA (or GQA) checkpoint's KV heads into N groups by mean-pooling.

At load the runner builds the model with num_key_value_heads = kv_head_groups
(config.strategy.served_model_config) and reads the checkpoint through `gqa_transform`, so the
converted model is an ordinary GQA model to every other part of the engine.

The GQA paper's uptraining recipe (Ainslie et al., 2023): each group's key and value projection is
the mean of the original heads' projections. Query head h then reads group h // (Hq / N), the
grouping HF's `repeat_kv` already uses, so consecutive KV heads are merged.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.config.strategy import gqa_groups

_KV_KEY = re.compile(r"\.(k_proj|v_proj)\.(weight|bias)$")


def mean_pool_heads(tensor: torch.Tensor, num_kv_heads: int, groups: int) -> torch.Tensor:
    """Projection weight [Hkv*D, hidden] or bias [Hkv*D] -> [groups*D, ...]: mean over consecutive heads."""
    if groups <= 0 or num_kv_heads % groups != 0:
        raise ValueError(f"kv_head_groups={groups} must be a positive divisor of num_key_value_heads={num_kv_heads}")
    rows = tensor.shape[0]
    if rows % num_kv_heads != 0:
        raise ValueError(f"projection has {rows} rows, not a multiple of num_key_value_heads={num_kv_heads}")
    head_dim = rows // num_kv_heads
    per_group = num_kv_heads // groups
    grouped = tensor.float().reshape(groups, per_group, head_dim, *tensor.shape[1:])
    return grouped.mean(dim=1).reshape(groups * head_dim, *tensor.shape[1:]).to(tensor.dtype)


def convert_state_dict_to_gqa(
    state_dict: dict[str, torch.Tensor], num_kv_heads: int, groups: int
) -> dict[str, torch.Tensor]:
    """A new state dict with every `*.k_proj` / `*.v_proj` weight and bias mean-pooled to `groups` heads.

    The caller sets `num_key_value_heads = groups` in the config; all other tensors are shared.
    """
    converted = dict(state_dict)
    touched = 0
    for name, tensor in state_dict.items():
        if _KV_KEY.search(name):
            converted[name] = mean_pool_heads(tensor, num_kv_heads, groups)
            touched += 1
    if touched == 0:
        raise ValueError("no k_proj/v_proj tensors found; GQA conversion needs HF Llama/Qwen2-style names")
    return converted


def gqa_transform(
    config: EngineConfig, served: ModelConfig
) -> Callable[[str, torch.Tensor], torch.Tensor] | None:
    """The load transform for attention='gqa' (None when the checkpoint's heads are served as they are)."""
    groups = gqa_groups(config)
    if groups is None:
        return None
    head_dim = served.head_dim
    # kept for calibrated grouping (calibrate.py) and the unmerged fallback path (reserve.py); apply.py drops
    # what it does not keep
    originals: dict[str, torch.Tensor] = {}
    keep = config.conversion_calibration is not None or config.fallback_reserve > 0

    def pool(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if not _KV_KEY.search(name):
            return tensor
        heads = tensor.shape[0] // head_dim
        if keep and heads != groups:
            originals[name] = tensor.detach().to("cpu", copy=True)
        return tensor if heads == groups else mean_pool_heads(tensor, heads, groups)

    pool.touches = _KV_KEY.search  # type: ignore[attr-defined]  # the loader reads these whole (TP slices after)
    pool.originals = originals  # type: ignore[attr-defined]
    return pool
