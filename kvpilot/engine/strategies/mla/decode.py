"""Batched decode over the MLA conversion's paged latent cache: K decompressed once per KV head, V absorbed.

The cached row of token n is the SVD latent c_n (strategies/mla/svd.py). For one query per
sequence:
- K_n = RoPE_n(up_k c_n + b_k): every dim of these checkpoints rotates, so up_k cannot be absorbed into
  the query; it is decompressed for the whole batch at once (one gather of the latent rows, one matmul
  per layer), once per KV head rather than per query head (GQA groups share it), in the layout
  [B, Hkv, D, L] the score matmul reads directly.
- V_n = up_v c_n + b_v has no RoPE, so sum_n p_n V_n = up_v (sum_n p_n c_n) + b_v (the p_n sum to 1):
  each head's probability-weighted latent is projected once and the context's V is never built
  (weight absorption, as DeepSeek's MLA decode does for its value side).
What depends on the step only (gather index, padding mask, RoPE angles) is computed by the first
layer and reused by the others (`DecodePlanner`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodePlan:
    """One decode step's view of the cache, shared by every layer: which rows, which are padding."""

    block_index: torch.Tensor  # [B, nblk] long: block ids (padding clamped to 0)
    length: int  # L: the longest context in the batch
    invalid: torch.Tensor | None  # [B, L] bool, True past a sequence's context; None if all lengths are L
    score_bias: torch.Tensor | None  # [B, 1, 1, L]: 0 or -inf, in the scores' dtype
    cos: torch.Tensor  # [D/2, L] RoPE cos of positions 0..L-1 (the cached tokens' positions)
    sin: torch.Tensor  # [D/2, L]

    def gather(self, cache: torch.Tensor) -> torch.Tensor:
        """cache [num_blocks, block_size, r] -> the batch's latent rows [B, L, r], zero past each context."""
        batch = self.block_index.shape[0]
        rows = cache.index_select(0, self.block_index.reshape(-1))  # faster than cache[index] on a CPU
        rows = rows.view(batch, -1, cache.shape[2])[:, : self.length]
        # slots past a context may hold stale rows: p = 0 there, but 0 * NaN is NaN
        if self.invalid is not None:
            rows = rows.masked_fill(self.invalid[:, :, None], 0.0)
        return rows


class DecodePlanner:
    """Builds a step's DecodePlan once (the first layer) and hands it to the other layers of the step.

    The RoPE table depends on positions only, so it is kept across steps and grown as contexts grow.
    A step is recognised by the identity of its decode block table tensor, held here so that it
    cannot be freed and its id reused by a later step.
    """

    def __init__(self, inv_freq: torch.Tensor) -> None:
        self.inv_freq = inv_freq
        self._key: tuple[torch.Tensor, torch.Tensor, torch.dtype] | None = None
        self._plan: DecodePlan | None = None
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    def plan(
        self, block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, dtype: torch.dtype
    ) -> DecodePlan:
        key = self._key
        if key is not None and key[0] is block_tables and key[1] is context_lens and key[2] == dtype:
            assert self._plan is not None
            return self._plan
        shortest, longest = (int(x) for x in torch.aminmax(context_lens))  # the step's one host sync
        nblk = -(-longest // block_size)
        block_index = block_tables[:, :nblk].long().clamp(min=0)
        invalid = score_bias = None
        if shortest != longest:
            positions = torch.arange(longest, device=context_lens.device)
            invalid = positions[None, :] >= context_lens[:, None]
            score_bias = torch.zeros(invalid.shape, dtype=dtype, device=invalid.device)
            score_bias = score_bias.masked_fill(invalid, float("-inf"))[:, None, None, :]
        cos, sin = self._rope_table(longest, dtype, block_tables.device)
        self._key = (block_tables, context_lens, dtype)
        self._plan = DecodePlan(block_index, longest, invalid, score_bias, cos, sin)
        return self._plan

    def _rope_table(
        self, length: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [D/2, length] exactly as RotaryEmbedding computes them (fp32 angles, cast to dtype)."""
        rope = self._rope
        if rope is None or rope[0].shape[1] < length or rope[0].dtype != dtype or rope[0].device != device:
            size = max(length, 2 * rope[0].shape[1] if rope is not None else 256)
            positions = torch.arange(size, device=device).float()
            freqs = self.inv_freq.to(device).float()[:, None] * positions[None, :]
            rope = self._rope = (freqs.cos().to(dtype), freqs.sin().to(dtype))
        return rope[0][:, :length], rope[1][:, :length]


def converted_mla_decode(
    q: torch.Tensor,
    rows: torch.Tensor,
    plan: DecodePlan,
    up_k: torch.Tensor,
    k_bias: torch.Tensor | None,
    up_v: torch.Tensor,
    v_bias: torch.Tensor | None,
    num_kv_heads: int,
    scale: float,
) -> torch.Tensor:
    """q [B, H, D] (after RoPE) over latent rows [B, L, r] -> attention output [B, H, Dv].

    up_k [Hkv*D, r], up_v [Hkv*Dv, r]; query head h reads KV head h // (H / Hkv) (HF's repeat_kv).
    """
    batch, heads, head_dim = q.shape
    length, rank = rows.shape[1], rows.shape[2]
    group = heads // num_kv_heads
    q = (q * scale).view(batch, num_kv_heads, group, head_dim)
    scores = key_scores(q, rows, plan.cos, plan.sin, up_k, k_bias)  # [B, Hkv, G, L]
    if plan.score_bias is not None:
        scores = scores + plan.score_bias
    softmax_dtype = torch.promote_types(scores.dtype, torch.float32)
    probs = torch.softmax(scores, dim=-1, dtype=softmax_dtype).to(rows.dtype)
    weighted = torch.matmul(probs.view(batch, heads, length), rows)  # [B, H, r]: sum_n p_n c_n per head
    value_dim = up_v.shape[0] // num_kv_heads
    w_uv = up_v.view(num_kv_heads, value_dim, rank).transpose(1, 2)  # [Hkv, r, Dv]
    out = torch.matmul(weighted.view(batch, num_kv_heads, group, rank), w_uv)  # [B, Hkv, G, Dv]
    if v_bias is not None:
        out = out + v_bias.view(num_kv_heads, 1, value_dim)
    return out.reshape(batch, heads, value_dim).to(q.dtype)


def key_scores(
    q: torch.Tensor,
    rows: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    up_k: torch.Tensor,
    k_bias: torch.Tensor | None,
) -> torch.Tensor:
    """Scaled q [B, Hkv, G, D] against RoPE(up_k c_n + b_k) for rows [B, L, r] -> scores [B, Hkv, G, L].

    The decompressed keys ([B, Hkv*D, L], D times the scores' size) are built a tile of sequences and
    positions at a time, `_tile_elements` at most: on a CPU a tile stays in cache (and below glibc's
    mmap threshold, so it is not faulted in afresh every layer); on a GPU the budget bounds the peak
    memory and is normally one tile.
    """
    batch, length = rows.shape[0], rows.shape[1]
    width = up_k.shape[0]
    budget = _tile_elements(rows.device)
    if batch * width * length <= budget:
        return _tile_scores(q, rows, cos, sin, up_k, k_bias)
    seqs = max(1, budget // (width * length))
    span = length if seqs > 1 else max(1, budget // width)
    scores = torch.empty(*q.shape[:3], length, dtype=q.dtype, device=q.device)
    for s in range(0, batch, seqs):
        for p in range(0, length, span):
            scores[s : s + seqs, :, :, p : p + span] = _tile_scores(
                q[s : s + seqs], rows[s : s + seqs, p : p + span], cos[:, p : p + span], sin[:, p : p + span],
                up_k, k_bias,
            )  # fmt: skip
    return scores


def _tile_elements(device: torch.device) -> int:
    return 1 << 28 if device.type == "cuda" else 1 << 19


def _tile_scores(
    q: torch.Tensor,
    rows: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    up_k: torch.Tensor,
    k_bias: torch.Tensor | None,
) -> torch.Tensor:
    batch, num_kv_heads, _, head_dim = q.shape
    length, half = rows.shape[1], head_dim // 2
    kt = torch.matmul(up_k, rows.transpose(1, 2))  # [b, Hkv*D, l]: each KV head's keys, once for its group
    if k_bias is not None:
        kt.add_(k_bias[:, None])
    kt = kt.view(batch, num_kv_heads, head_dim, length)
    x1, x2 = kt[:, :, :half], kt[:, :, half:]  # rotate-half RoPE at the cached positions
    key = torch.empty_like(kt)
    torch.mul(x1, cos, out=key[:, :, :half]).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=key[:, :, half:]).addcmul_(x1, sin)
    return torch.matmul(q, key)
