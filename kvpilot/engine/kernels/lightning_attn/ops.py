"""Lightning attention ops, dispatched to the Triton kernels or the torch references (`KVPILOT_KERNELS`)."""

from __future__ import annotations

import torch

from kvpilot.engine.kernels.dispatch import backend_for
from kvpilot.engine.kernels.lightning_attn.reference import (
    lightning_decode_reference,
    lightning_prefill_reference,
)


def lightning_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    slopes: torch.Tensor,
    state_pool: torch.Tensor,
    slot_ids: torch.Tensor,
) -> torch.Tensor:
    """Packed varlen chunks continuing from state_pool[slot_ids] (updated in place) -> o [T, H, Dv]."""
    if backend_for(q) == "triton":
        from kvpilot.engine.kernels.lightning_attn.prefill import lightning_prefill_triton

        return lightning_prefill_triton(q, k, v, cu_seqlens, slopes, state_pool, slot_ids)
    return lightning_prefill_reference(q, k, v, cu_seqlens, slopes, state_pool, slot_ids)


def lightning_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slopes: torch.Tensor,
    state_pool: torch.Tensor,
    slot_ids: torch.Tensor,
) -> torch.Tensor:
    """One token per sequence; state_pool[slot_ids] updated in place -> o [B, H, Dv]."""
    if backend_for(q) == "triton":
        from kvpilot.engine.kernels.lightning_attn.decode import lightning_decode_triton

        return lightning_decode_triton(q, k, v, slopes, state_pool, slot_ids)
    return lightning_decode_reference(q, k, v, slopes, state_pool, slot_ids)
