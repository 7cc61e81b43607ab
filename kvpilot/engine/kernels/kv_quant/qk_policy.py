"""When an int8 cache's decode scores use the int8-rounded query (torch-free: both backends ask here)."""

from __future__ import annotations

import torch

INT8_QK_MIN_HEAD_DIM = 32  # an int8 MMA reduces over at least 32 elements


def int8_scores(cache_dtype: torch.dtype, head_dim: int) -> bool:
    """True for int8 caches with head_dim >= 32: the decode kernel's default, mirrored by the torch path."""
    return cache_dtype == torch.int8 and head_dim >= INT8_QK_MIN_HEAD_DIM
