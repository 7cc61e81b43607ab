"""MLA cache ops, dispatched to the Triton kernel or the torch reference (`KVPILOT_KERNELS`)."""

from __future__ import annotations

import torch

from kvpilot.engine.kernels.dispatch import backend_for
from kvpilot.engine.kernels.mla_decode.reference import mla_decode_reference


def store_latent(c_kv: torch.Tensor, k_pe: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write [c_kv ; k_pe] rows [N, L + R] into the latent cache at slot_mapping (-1 skips)."""
    if backend_for(c_kv) == "triton":
        from kvpilot.engine.kernels.mla_decode.store import store_latent_triton

        store_latent_triton(c_kv, k_pe, cache, slot_mapping)
    else:
        from kvpilot.engine.kernels.mla_decode.store import store_latent_reference

        store_latent_reference(c_kv, k_pe, cache, slot_mapping)


def mla_decode(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Absorbed MLA decode -> latent output [B, H, L] in q_latent's dtype."""
    if backend_for(q_latent) == "triton":
        from kvpilot.engine.kernels.mla_decode.kernel import mla_decode_triton

        return mla_decode_triton(q_latent, q_pe, kv_cache, block_tables, context_lens, scale)
    return mla_decode_reference(q_latent, q_pe, kv_cache, block_tables, context_lens, scale).to(q_latent.dtype)
