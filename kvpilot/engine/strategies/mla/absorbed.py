"""Absorbed decode of the partial-RoPE MLA conversion: attention from the latent, the context never decompressed.

Cache row of token n (per layer): [c_n (r) ; k_rope,n (Hkv x R, after RoPE)] (strategies/mla/partial.py).
Query head h reads KV head g = h // (H / Hkv); its query is [q_nope,h (D - R, no RoPE) ; q_rope,h (R)].
- score_h,n = q_rope,h . k_rope,g,n + q_nope,h . (W_UK,g c_n + b_K,g)
            = q_rope,h . k_rope,g,n + (W_UK,g^T q_nope,h) . c_n + const_h:
  W_UK is absorbed into the query once per step (`absorb_query`); q_nope,h . b_K,g is the same for every
  n, and softmax ignores it.
- out_h = sum_n p_n (W_UV,g c_n + b_V,g) = W_UV,g (sum_n p_n c_n) + b_V,g (`project_values`).
So a step reads r + Hkv x R numbers per cached token, where exact attention reads 2 x Hkv x D.

`latent_attention_torch` is the batched torch path (CPU, or KVPILOT_KERNELS=torch); on CUDA (and under
TRITON_INTERPRET) `latent_attention_triton` runs the native DeepSeek kernel kernels/mla_decode with
`pe_group=R`: its rows are [latent ; rope keys of every KV head], so the kernel loads each query head's
q_rope into its own KV head's R columns of a zero [Hkv x R] query (a masked load: the block-diagonal
query is never built in memory), and its q_pe . k_pe is exactly q_rope,h . k_rope,g. That costs Hkv x R
multiply-adds per head and token where R would do, and reads no more memory (each row is read whole
either way).
"""

from __future__ import annotations

import torch

from kvpilot.engine.strategies.mla.decode import DecodePlan


def absorb_query(q_nope: torch.Tensor, up_k: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q_nope [B, H, Dn] with W_UK = up_k [Hkv*Dn, r] -> latent queries W_UK,g^T q_nope,h [B, H, r].

    One batched matmul per KV head over all its queries ([Hkv, B*G, Dn] x [Hkv, Dn, r]): broadcasting
    [B, Hkv, G, Dn] against [Hkv, Dn, r] with torch.matmul would copy the weight once per sequence
    (2 ms of copies per step at batch 64 on the H200, docs/benchmarks.md)."""
    batch, heads, dn = q_nope.shape
    group, rank = heads // num_kv_heads, up_k.shape[1]
    w_uk = up_k.view(num_kv_heads, dn, rank)  # [Hkv, Dn, r]
    q = q_nope.reshape(batch, num_kv_heads, group, dn).transpose(0, 1).reshape(num_kv_heads, batch * group, dn)
    out = torch.bmm(q, w_uk)  # [Hkv, B*G, r]
    return out.view(num_kv_heads, batch, group, rank).transpose(0, 1).reshape(batch, heads, rank)


def project_values(
    o_latent: torch.Tensor, up_v: torch.Tensor, v_bias: torch.Tensor | None, num_kv_heads: int
) -> torch.Tensor:
    """Latent outputs sum_n p_n c_n [B, H, r] -> values [B, H, Dv] = W_UV,g o_h + b_V,g (one batched
    matmul per KV head, as `absorb_query`)."""
    batch, heads, rank = o_latent.shape
    group, value_dim = heads // num_kv_heads, up_v.shape[0] // num_kv_heads
    w_uv = up_v.view(num_kv_heads, value_dim, rank).transpose(1, 2)  # [Hkv, r, Dv], a view
    o = o_latent.reshape(batch, num_kv_heads, group, rank).transpose(0, 1).reshape(num_kv_heads, batch * group, rank)
    out = torch.bmm(o, w_uv).view(num_kv_heads, batch, group, value_dim)  # [Hkv, B, G, Dv]
    if v_bias is not None:
        out = out + v_bias.view(num_kv_heads, 1, 1, value_dim)
    return out.transpose(0, 1).reshape(batch, heads, value_dim)


def latent_attention_torch(
    q_latent: torch.Tensor, q_rope: torch.Tensor, rows: torch.Tensor, plan: DecodePlan, scale: float,
    num_kv_heads: int,
) -> torch.Tensor:
    """q_latent [B, H, r], q_rope [B, H, R] over the batch's cache rows [B, L, r + Hkv*R] (DecodePlan.gather:
    zero past each context) -> latent outputs [B, H, r]."""
    batch, heads, rank = q_latent.shape
    rope = q_rope.shape[2]
    length, group = rows.shape[1], heads // num_kv_heads
    latent = rows[:, :, :rank]
    scores = torch.matmul(q_latent * scale, latent.transpose(1, 2)).view(batch, num_kv_heads, group, length)
    if rope:
        keys = rows[:, :, rank:].view(batch, length, num_kv_heads, rope).permute(0, 2, 3, 1)  # [B, Hkv, R, L]
        scores = scores + torch.matmul((q_rope * scale).view(batch, num_kv_heads, group, rope), keys)
    if plan.score_bias is not None:
        scores = scores + plan.score_bias
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    return torch.matmul(probs.to(rows.dtype).view(batch, heads, length), latent)


def latent_attention_triton(
    q_latent: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, num_kv_heads: int, num_splits: int | None = None,
) -> torch.Tensor:
    """The same over the paged cache [blocks, page, r + Hkv*R] through kernels/mla_decode -> [B, H, r]
    (`num_splits`: the kernel's split-K count, default its own choice)."""
    from kvpilot.engine.kernels.mla_decode.kernel import mla_decode_triton

    return mla_decode_triton(
        q_latent.to(cache.dtype).contiguous(), q_rope.to(cache.dtype), cache, block_tables,  # q_rope: any row
        context_lens, scale, num_splits, pe_group=q_rope.shape[2],  # strides, its last dim contiguous
    )
