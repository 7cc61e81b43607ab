"""Pure-torch fp32 references for MLA: absorbed paged decode, and unabsorbed DeepSeek attention."""

from __future__ import annotations

import torch


def split_kv_b_proj(
    kv_b_weight: torch.Tensor, num_heads: int, qk_nope_head_dim: int, v_head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF `kv_b_proj.weight` [H*(Dn+Dv), L] -> (W_UK [H, Dn, L], W_UV [H, Dv, L])."""
    rank = kv_b_weight.shape[1]
    expected = num_heads * (qk_nope_head_dim + v_head_dim)
    if kv_b_weight.shape[0] != expected:
        raise ValueError(f"kv_b_proj has {kv_b_weight.shape[0]} rows, expected H*(Dn+Dv) = {expected}")
    w = kv_b_weight.view(num_heads, qk_nope_head_dim + v_head_dim, rank)
    return w[:, :qk_nope_head_dim], w[:, qk_nope_head_dim:]


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """q_nope [B, H, Dn] @ W_UK [H, Dn, L] -> absorbed query [B, H, L] (fp32)."""
    return torch.einsum("bhd,hdl->bhl", q_nope.float(), w_uk.float())


def project_output(o_latent: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """Latent output [B, H, L] @ W_UV^T -> per-head values [B, H, Dv] (fp32)."""
    return torch.einsum("bhl,hvl->bhv", o_latent.float(), w_uv.float())


def gather_latent(kv_cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """One sequence's first context_len cache rows [context_len, L + R]."""
    page = kv_cache.shape[1]
    ids = block_table[: -(-context_len // page)].long()
    return kv_cache[ids].reshape(-1, kv_cache.shape[2])[:context_len]


def mla_decode_reference(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Absorbed MLA decode: q_latent [B, H, L], q_pe [B, H, R] over the paged cache -> [B, H, L] fp32."""
    rank = q_latent.shape[2]
    out = torch.empty(q_latent.shape, dtype=torch.float32, device=q_latent.device)
    for b, context_len in enumerate(context_lens.tolist()):
        rows = gather_latent(kv_cache, block_tables[b], context_len).float()
        c_kv, k_pe = rows[:, :rank], rows[:, rank:]
        scores = (q_latent[b].float() @ c_kv.T + q_pe[b].float() @ k_pe.T) * scale
        out[b] = scores.softmax(dim=-1) @ c_kv
    return out


def mla_attention_unabsorbed(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    c_kv: torch.Tensor,
    k_pe: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """DeepSeek attention as HF computes it, for one query per head over T cached tokens.

    q_nope [H, Dn], q_pe [H, R], c_kv [T, L], k_pe [T, R] (shared by all heads) -> [H, Dv] fp32:
    k = [c_kv W_UK^T ; k_pe], v = c_kv W_UV^T, softmax(q.k * scale) v.
    """
    k_nope = torch.einsum("tl,hdl->thd", c_kv.float(), w_uk.float())
    value = torch.einsum("tl,hvl->thv", c_kv.float(), w_uv.float())
    num_heads = q_nope.shape[0]
    key = torch.cat([k_nope, k_pe.float()[:, None, :].expand(-1, num_heads, -1)], dim=-1)
    query = torch.cat([q_nope.float(), q_pe.float()], dim=-1)
    scores = torch.einsum("hd,thd->ht", query, key) * scale
    return torch.einsum("ht,thv->hv", scores.softmax(dim=-1), value)
