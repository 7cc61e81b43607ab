"""Write MLA cache rows: per token [c_kv (kv_lora_rank) ; k_pe (rope dim)] at slot_mapping (-1 skipped)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.interpreter_compat import patch_interpreter
from kvpilot.engine.kernels.specialization import step_kernel

patch_interpreter()


@step_kernel
def _store_latent_kernel(
    c_ptr, pe_ptr, cache_ptr, slot_ptr, stride_c, stride_pe,
    RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    offs_l = tl.arange(0, BLOCK_L)
    offs_r = tl.arange(0, BLOCK_R)
    row = cache_ptr + slot * (RANK + ROPE)
    c = tl.load(c_ptr + token * stride_c + offs_l, mask=offs_l < RANK)
    pe = tl.load(pe_ptr + token * stride_pe + offs_r, mask=offs_r < ROPE)
    tl.store(row + offs_l, c.to(cache_ptr.dtype.element_ty), mask=offs_l < RANK)
    tl.store(row + RANK + offs_r, pe.to(cache_ptr.dtype.element_ty), mask=offs_r < ROPE)


def store_latent_reference(c_kv: torch.Tensor, k_pe: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Torch reference of `store_latent_triton`."""
    keep = slot_mapping >= 0
    rows = cache.view(-1, cache.shape[-1])
    rows[slot_mapping[keep].long()] = torch.cat([c_kv[keep], k_pe[keep]], dim=-1).to(cache.dtype)


def store_latent_triton(c_kv: torch.Tensor, k_pe: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """c_kv [N, L] (after kv_a_layernorm), k_pe [N, R] (after RoPE; R may be 0: rows of c_kv alone, the
    MLA conversion's latent) into cache [blocks, page, L + R]."""
    check_triton_device(c_kv, k_pe, cache, slot_mapping)
    assert c_kv.dim() == 2 and k_pe.dim() == 2 and c_kv.shape[0] == k_pe.shape[0], "c_kv [N, L], k_pe [N, R]"
    rank, rope = c_kv.shape[1], k_pe.shape[1]
    assert cache.dim() == 3 and cache.shape[2] == rank + rope and cache.is_contiguous(), (
        f"cache must be contiguous [blocks, page, {rank + rope}], got {tuple(cache.shape)}"
    )
    assert c_kv.stride(1) == 1 and k_pe.stride(1) == 1, "last dims must be contiguous"
    assert slot_mapping.dtype == torch.int32 and slot_mapping.shape == (c_kv.shape[0],), "slot_mapping int32 [N]"
    if c_kv.shape[0] == 0:
        return
    _store_latent_kernel[(c_kv.shape[0],)](
        c_kv, k_pe, cache, slot_mapping, c_kv.stride(0), k_pe.stride(0),
        RANK=rank, ROPE=rope, BLOCK_L=triton.next_power_of_2(rank), BLOCK_R=max(1, triton.next_power_of_2(rope)),
    )
