"""Recurrent lightning-attention decode: one token per sequence, state in a pool indexed by slot.

Program (sequence, head, Dv block): S = exp(-slope) * S + k^T v; o = q S; S written back in place.
A memory-bound update: each step reads and writes the fp32 state once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.interpreter_compat import patch_interpreter
from kvpilot.engine.kernels.lightning_attn.checks import check_qkv_state
from kvpilot.engine.kernels.specialization import step_kernel

patch_interpreter()


@step_kernel
def _lightning_decode_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, slopes_ptr, state_ptr, slot_ptr,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_oh,
    stride_ss, stride_sh, stride_sk,
    DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    if slot < 0:
        return
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + b * stride_kb + h * stride_kh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    decay = tl.exp(-tl.load(slopes_ptr + h).to(tl.float32))
    state_off = slot * stride_ss + h * stride_sh + offs_k[:, None] * stride_sk + offs_v[None, :]
    state_mask = mask_k[:, None] & mask_v[None, :]
    state = tl.load(state_ptr + state_off, mask=state_mask, other=0.0)
    state = state * decay + k[:, None] * v[None, :]
    tl.store(state_ptr + state_off, state, mask=state_mask)
    o = tl.sum(q[:, None] * state, axis=0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_v, o.to(o_ptr.dtype.element_ty), mask=mask_v)


def lightning_decode_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slopes: torch.Tensor,
    state_pool: torch.Tensor,
    slot_ids: torch.Tensor,
    block_v: int | None = None,
) -> torch.Tensor:
    """q, k [B, H, Dk], v [B, H, Dv]; state_pool fp32 [slots, H, Dk, Dv] updated at slot_ids int32 [B]
    (-1 skips, its output row is zero) -> o [B, H, Dv]."""
    check_triton_device(q, k, v, slopes, state_pool, slot_ids)
    num_heads, dk, dv = check_qkv_state(q, k, v, slopes, state_pool, "B")
    batch = q.shape[0]
    assert slot_ids.shape == (batch,) and slot_ids.dtype == torch.int32, "slot_ids must be int32 [B]"
    out = torch.zeros(batch, num_heads, dv, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    if block_v is None:
        # measured on H200 (docs/benchmarks.md): 64-wide tiles win once there are many programs,
        # 32-wide ones at small batch where more programs are needed to fill the SMs
        block_v = 64 if batch * num_heads * triton.cdiv(dv, 64) >= 2048 else 32
    block_v = min(block_v, triton.next_power_of_2(dv))
    _lightning_decode_kernel[(batch, num_heads, triton.cdiv(dv, block_v))](
        q, k, v, out, slopes, state_pool, slot_ids,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        state_pool.stride(0), state_pool.stride(1), state_pool.stride(2),
        DK=dk, DV=dv, BLOCK_K=triton.next_power_of_2(dk), BLOCK_V=block_v,
    )
    return out
