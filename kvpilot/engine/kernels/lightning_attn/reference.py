"""Pure-torch fp32 references for lightning attention: the naive token-by-token recurrence."""

from __future__ import annotations

import torch


def minimax_slopes(num_heads: int, layer_idx: int, num_layers: int) -> torch.Tensor:
    """Per-head decay slopes [H] (fp32) exactly as HF `MiniMaxLightningAttention.get_slope_rate`."""
    base = 1 / (2 ** (8 / num_heads))
    exponent = torch.arange(num_heads) + 1
    factor = 1 - layer_idx / (num_layers - 1 + 1e-5) + 1e-5
    return (base**exponent) * factor


def lightning_recurrent_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q, k [T, H, Dk], v [T, H, Dv], state [H, Dk, Dv] -> (o [T, H, Dv], new state), fp32."""
    decay = torch.exp(-slopes.float())[:, None, None]
    s = state.float().clone()
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float32, device=q.device)
    for t in range(q.shape[0]):
        s = decay * s + k[t].float()[:, :, None] * v[t].float()[:, None, :]
        out[t] = torch.einsum("hk,hkv->hv", q[t].float(), s)
    return out, s


def lightning_prefill_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    slopes: torch.Tensor,
    state_pool: torch.Tensor,
    slot_ids: torch.Tensor,
) -> torch.Tensor:
    """Packed varlen q, k [T, H, Dk], v [T, H, Dv]; continues each sequence from state_pool[slot_ids[b]]
    and writes the new state back (slot -1 skips the sequence, its rows stay zero). Returns o [T, H, Dv]."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    bounds = cu_seqlens.tolist()
    for b, slot in enumerate(slot_ids.tolist()):
        if slot < 0:
            continue
        lo, hi = bounds[b], bounds[b + 1]
        o, s = lightning_recurrent_reference(q[lo:hi], k[lo:hi], v[lo:hi], slopes, state_pool[slot])
        out[lo:hi] = o.to(q.dtype)
        state_pool[slot] = s.to(state_pool.dtype)
    return out


def lightning_decode_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slopes: torch.Tensor,
    state_pool: torch.Tensor,
    slot_ids: torch.Tensor,
) -> torch.Tensor:
    """One token per sequence q, k [B, H, Dk], v [B, H, Dv]; updates state_pool[slot_ids] in place."""
    cu = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return lightning_prefill_reference(q, k, v, cu, slopes, state_pool, slot_ids)
