"""Pure-torch fp32 references for the 8-bit KV caches: quantisation, store, dequantisation, decode."""

from __future__ import annotations

import torch

INT8_MAX = 127.0
# scale = amax * fl(1/127): a multiplication is rounded the same way by torch (CPU and CUDA) and Triton
INV_INT8_MAX = 1.0 / INT8_MAX
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
MODES = ("int8", "fp8")
# fp8 scales are fixed per layer from the first write; leave headroom for later, larger values.
FP8_CALIBRATION_HEADROOM = 2.0
_EPS = 1e-8


def mode_of(cache: torch.Tensor) -> str:
    """'int8' or 'fp8' from the cache dtype; anything else is an error."""
    if cache.dtype == torch.int8:
        return "int8"
    if cache.dtype == FP8_DTYPE:
        return "fp8"
    raise ValueError(f"8-bit KV cache must be int8 or float8_e4m3fn, got {cache.dtype}")


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (int8 [..., D], fp32 scale [...]): symmetric, one scale per row (token and head)."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) * INV_INT8_MAX).clamp_min(_EPS)
    q = torch.round(xf / scale[..., None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def calibrate_fp8_scale(x: torch.Tensor, headroom: float = FP8_CALIBRATION_HEADROOM) -> torch.Tensor:
    """x [N, H, D] (the layer's first write) -> fp32 per-head scale [H] mapping amax*headroom to 448."""
    amax = x.float().abs().amax(dim=(0, 2))
    return (amax * headroom / FP8_MAX).clamp_min(_EPS)


def quantize_fp8(x: torch.Tensor, head_scale: torch.Tensor) -> torch.Tensor:
    """x [N, H, D], head_scale [H] -> float8_e4m3fn, saturating at +-448."""
    return (x.float() / head_scale[None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize(cache_q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Dequantise cache rows to fp32: int8 rows with their per-row scale [...] or fp8 with per-head [H]."""
    if mode_of(cache_q) == "int8":
        return cache_q.float() * scale.float()[..., None]
    return cache_q.float() * scale.float()[:, None]


def store_kvcache_quant_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Quantise key/value [N, Hkv, D] into 8-bit caches at slot_mapping [N]; slot -1 skips the row.

    int8: k_scale/v_scale are scale caches [num_blocks, block_size, Hkv] and are written here.
    fp8: k_scale/v_scale are the layer's fixed per-head scales [Hkv] and are only read.
    """
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    for x, cache, scale in ((key[keep], k_cache, k_scale), (value[keep], v_cache, v_scale)):
        if mode_of(cache) == "int8":
            q, s = quantize_int8(x)
            cache[blocks, offsets] = q
            scale[blocks, offsets] = s.to(scale.dtype)
        else:
            cache[blocks, offsets] = quantize_fp8(x, scale)


def gather_dequantized(
    cache_q: torch.Tensor, scale: torch.Tensor, block_table: torch.Tensor, context_len: int
) -> torch.Tensor:
    """One sequence's first context_len tokens, dequantised to fp32 [context_len, Hkv, D]."""
    block_size = cache_q.shape[1]
    num_blocks = -(-context_len // block_size)
    ids = block_table[:num_blocks].long()
    rows = cache_q[ids].reshape(-1, *cache_q.shape[2:])[:context_len]
    if mode_of(cache_q) == "int8":
        row_scale = scale[ids].reshape(-1, cache_q.shape[2])[:context_len]
        return dequantize(rows, row_scale)
    return dequantize(rows, scale)


def attend_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Hq, D] against k, v [N, Hkv, D] (GQA by repeat) in fp32 -> [Hq, D]."""
    group = q.shape[0] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,nhd->hn", q.float(), k) * scale
    return torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v)


def quantize_query_int8(q: torch.Tensor) -> torch.Tensor:
    """q [..., D] rounded as the int8-score decode kernel does (per row, scale amax/127, half away
    from zero), returned dequantised in fp32: the query the int8 x int8 scores actually see."""
    qf = q.float()
    q_scale = qf.abs().amax(dim=-1).clamp_min(1e-30) / INT8_MAX
    scaled = qf / q_scale[..., None]
    return torch.trunc(scaled + 0.5 * torch.sign(scaled)).clamp(-INT8_MAX, INT8_MAX) * q_scale[..., None]


def paged_attention_decode_quant_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    int8_qk: bool = False,
) -> torch.Tensor:
    """q [B, Hq, D]: each sequence's one query over its dequantised 8-bit paged context, fp32 math.

    int8_qk: the scores use `quantize_query_int8(q)` (int8 caches), as the Triton kernel's default.
    """
    out = torch.empty_like(q)
    q_scores = quantize_query_int8(q) if int8_qk else q
    for b, context_len in enumerate(context_lens.tolist()):
        k = gather_dequantized(k_cache, k_scale, block_tables[b], context_len)
        v = gather_dequantized(v_cache, v_scale, block_tables[b], context_len)
        out[b] = attend_fp32(q_scores[b], k, v, scale).to(q.dtype)
    return out


def dequantize_blocks_reference(
    cache_q: torch.Tensor, scale: torch.Tensor, block_ids: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """Blocks block_ids [n] of an 8-bit cache, dequantised to out_dtype [n, block_size, Hkv, D]; an id of -1
    (block-table padding) gives zeros."""
    ids = block_ids.long().clamp_min(0)
    if mode_of(cache_q) == "int8":
        out = dequantize(cache_q[ids], scale[ids]).to(out_dtype)
    else:
        out = dequantize(cache_q[ids], scale).to(out_dtype)
    return out.masked_fill((block_ids < 0).view(-1, 1, 1, 1), 0)
