"""Chunked lightning-attention prefill: intra-chunk decayed causal product + inter-chunk state.

Program (sequence, head, Dv block) walks its sequence in CHUNK-token chunks. With lambda = exp(-s),
chunk rows i, j in [0, n) and S the state before the chunk:
  o_i   = sum_{j<=i} lambda^(i-j) (q_i.k_j) v_j  +  lambda^(i+1) q_i S
  S_new = lambda^n S + sum_j lambda^(n-1-j) k_j^T v_j
(the same block decomposition as HF `MiniMaxLightningAttention`). The state is read from and
written back to the state pool in fp32; the products run in the input dtype with fp32 accumulation.
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
def _lightning_prefill_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, cu_ptr, slopes_ptr, state_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_ss, stride_sh, stride_sk,
    DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, CHUNK: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    if slot < 0:
        return
    seq_start = tl.load(cu_ptr + b)
    seq_end = tl.load(cu_ptr + b + 1)
    slope = tl.load(slopes_ptr + h).to(tl.float32)

    offs_c = tl.arange(0, CHUNK)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    state_off = slot * stride_ss + h * stride_sh + offs_k[:, None] * stride_sk + offs_v[None, :]
    state_mask = mask_k[:, None] & mask_v[None, :]
    state = tl.load(state_ptr + state_off, mask=state_mask, other=0.0)

    pos = offs_c.to(tl.float32)
    dist = pos[:, None] - pos[None, :]
    diag = tl.where(dist >= 0, tl.exp(-slope * tl.maximum(dist, 0.0)), 0.0)
    q_decay = tl.exp(-slope * (pos + 1.0))
    for c0 in range(seq_start, seq_end, CHUNK):
        n = tl.minimum(seq_end - c0, CHUNK)
        rows = c0 + offs_c
        mask_c = offs_c < n
        q = tl.load(q_ptr + rows[:, None] * stride_qt + h * stride_qh + offs_k[None, :],
                    mask=mask_c[:, None] & mask_k[None, :], other=0.0)
        k = tl.load(k_ptr + rows[:, None] * stride_kt + h * stride_kh + offs_k[None, :],
                    mask=mask_c[:, None] & mask_k[None, :], other=0.0)
        v = tl.load(v_ptr + rows[:, None] * stride_vt + h * stride_vh + offs_v[None, :],
                    mask=mask_c[:, None] & mask_v[None, :], other=0.0)
        scores = tl.dot(q, tl.trans(k)) * diag
        o = tl.dot(scores.to(v.dtype), v)
        o += tl.dot((q * q_decay[:, None]).to(q.dtype), state.to(q.dtype))
        tl.store(o_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_v[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=mask_c[:, None] & mask_v[None, :])
        k_decay = tl.where(mask_c, tl.exp(-slope * tl.maximum(n.to(tl.float32) - 1.0 - pos, 0.0)), 0.0)
        state = state * tl.exp(-slope * n.to(tl.float32)) + tl.dot(tl.trans((k * k_decay[:, None]).to(k.dtype)), v)
    tl.store(state_ptr + state_off, state, mask=state_mask)


def lightning_prefill_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    slopes: torch.Tensor,
    state_pool: torch.Tensor,
    slot_ids: torch.Tensor,
    chunk: int = 64,
    block_v: int = 32,
    num_warps: int = 4,
) -> torch.Tensor:
    """Packed varlen q, k [T, H, Dk], v [T, H, Dv] from state_pool[slot_ids[b]] (fp32 [slots, H, Dk, Dv],
    updated in place; slot -1 skips a sequence and leaves its rows zero) -> o [T, H, Dv]."""
    check_triton_device(q, k, v, cu_seqlens, slopes, state_pool, slot_ids)
    num_heads, dk, dv = check_qkv_state(q, k, v, slopes, state_pool, "T")
    assert q.dtype == k.dtype == v.dtype, "q, k, v must share one dtype"
    assert cu_seqlens.dtype == torch.int32 and slot_ids.dtype == torch.int32, "cu_seqlens, slot_ids must be int32"
    batch = slot_ids.shape[0]
    assert cu_seqlens.shape == (batch + 1,), f"cu_seqlens must be [B+1] = [{batch + 1}]"
    assert chunk >= 16 and block_v >= 16, "tl.dot needs tiles of at least 16"
    out = torch.zeros(q.shape[0], num_heads, dv, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    block_v = min(block_v, max(16, triton.next_power_of_2(dv)))
    # fp32 inputs (tests, CPU-parity runs) need half the tiles to fit shared memory with one stage
    stages = {"num_stages": 1} if q.element_size() == 4 and q.is_cuda else {}
    if q.element_size() == 4 and q.is_cuda:
        chunk = min(chunk, 32)
    _lightning_prefill_kernel[(batch, num_heads, triton.cdiv(dv, block_v))](
        q, k, v, out, cu_seqlens, slopes, state_pool, slot_ids,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        state_pool.stride(0), state_pool.stride(1), state_pool.stride(2),
        DK=dk, DV=dv, BLOCK_K=max(16, triton.next_power_of_2(dk)), BLOCK_V=block_v, CHUNK=chunk,
        num_warps=num_warps, **stages,
    )
    return out
