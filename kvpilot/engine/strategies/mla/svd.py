"""MLA conversion: factorise K/V projections into one shared latent of rank r (MHA2MLA / Palu style).

W = [W_K(nope rows); W_V] [out, hidden] = U S V^T; keep r: down = V_r^T [r, hidden] (shared, the
cached latent is c = down x), up = U_r S_r, split into up_K and up_V. Truncated SVD is the best rank-r
approximation in Frobenius norm (Eckart-Young), so the error falls monotonically with r and is zero
at full rank. RoPE: `rope_dims` dims per KV head (whole rotate-half pairs (i, i + D/2): by default
the highest-frequency ones, or per head those `pairs` picks, strategies/mla/rope_select.py) stay
un-factorised and are cached exactly, post-RoPE; the others go through the latent. See
docs/strategies.md for the two ways the engine uses this (exact RoPE on every dim, or partial RoPE
with absorbed decode).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MlaConversion:
    """One layer's factorised K/V projections and their relative Frobenius reconstruction errors."""

    down: torch.Tensor  # [r, hidden]: latent c = down @ x, cached per token
    up_k: torch.Tensor  # [Hkv * (D - rope_dims), r]: factorised key dims
    up_v: torch.Tensor  # [Hkv * Dv, r]
    k_rope: torch.Tensor  # [Hkv * rope_dims, hidden]: exact key rows kept for RoPE, head by head
    rope_index: torch.Tensor  # [Hkv, rope_dims] dims of each KV head kept exact: [pairs ; pairs + D/2]
    nope_index: torch.Tensor  # [Hkv, D - rope_dims] dims of each KV head factorised, ascending
    rank: int
    error_k: float
    error_v: float
    error: float

    def report(self) -> str:
        return (
            f"mla latent_rank={self.rank}: relative reconstruction error K={self.error_k:.4f} "
            f"V={self.error_v:.4f} joint={self.error:.4f}"
        )


def check_rope_dims(head_dim: int, rope_dims: int) -> None:
    """rope_dims keeps whole rotate-half pairs: even, within 0..head_dim."""
    if rope_dims % 2 or not 0 <= rope_dims <= head_dim:
        raise ValueError(f"rope_dims={rope_dims} must be even and within 0..head_dim={head_dim}")


def rope_keep_index(head_dim: int, rope_dims: int) -> torch.Tensor:
    """Dims kept exact: the rope_dims/2 highest-frequency rotate_half pairs (i, i + D/2)."""
    check_rope_dims(head_dim, rope_dims)
    return pair_dims(torch.arange(rope_dims // 2), head_dim)


def pair_dims(pairs: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Pair indices [..., P] (each < D/2) -> their dims [..., 2P] as [pairs ; pairs + D/2]: a vector of
    rotate-half layout of its own, rotated by the pairs' frequencies."""
    return torch.cat([pairs, pairs + head_dim // 2], dim=-1)


def complement(index: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Per row of index [Hkv, R], the other dims of 0..head_dim-1, ascending: [Hkv, D - R]."""
    mask = torch.ones(index.shape[0], head_dim, dtype=torch.bool)
    mask.scatter_(1, index, False)
    return torch.arange(head_dim).expand(index.shape[0], -1)[mask].view(index.shape[0], -1)


def _relative_error(w: torch.Tensor, w_hat: torch.Tensor) -> float:
    norm = w.norm()
    return float((w - w_hat).norm() / norm) if norm > 0 else float((w - w_hat).norm())


def whitening(inputs: torch.Tensor, damping: float = 1e-4) -> torch.Tensor:
    """S [hidden, hidden], lower triangular, with S S^T = X^T X / T + damping (mean diagonal) I: then
    ||(W - W') X^T||_F = ||(W - W') S||_F sqrt(T), so the best rank-r W' for these inputs is the
    truncated SVD of W S, mapped back by S^-1 (activation-aware SVD, as SVD-LLM does)."""
    x = inputs.double()
    cov = x.T @ x / x.shape[0]
    cov += damping * cov.diagonal().mean().clamp_min(1e-12) * torch.eye(cov.shape[0], dtype=cov.dtype)
    return torch.linalg.cholesky(cov)


def factorize_kv(
    w_k: torch.Tensor, w_v: torch.Tensor, num_kv_heads: int, rank: int, rope_dims: int = 0,
    inputs: torch.Tensor | None = None, pairs: torch.Tensor | None = None,
) -> MlaConversion:
    """w_k [Hkv*D, hidden], w_v [Hkv*Dv, hidden] -> shared-latent factorisation of rank `rank` (fp32).

    `inputs` [T, hidden]: calibration activations of the layer; the factorisation then minimises the
    error of the K/V the layer produces on them rather than of the weights (`whitening`).
    `pairs` [Hkv, rope_dims/2]: the rotate-half pairs each KV head keeps exact (default: the
    highest-frequency ones, 0..rope_dims/2-1, for every head)."""
    head_dim = w_k.shape[0] // num_kv_heads
    if w_k.shape[0] != num_kv_heads * head_dim or w_v.shape[0] % num_kv_heads:
        raise ValueError(f"K/V rows {w_k.shape[0]}, {w_v.shape[0]} are not multiples of Hkv={num_kv_heads}")
    check_rope_dims(head_dim, rope_dims)
    if pairs is None:
        pairs = torch.arange(rope_dims // 2).expand(num_kv_heads, -1)
    if pairs.shape != (num_kv_heads, rope_dims // 2) or (pairs.numel() and not 0 <= int(pairs.min()) <= int(
        pairs.max()) < head_dim // 2):  # fmt: skip
        raise ValueError(f"pairs must be [Hkv={num_kv_heads}, {rope_dims // 2}] indices below {head_dim // 2}")
    keep = pair_dims(pairs.sort(dim=1).values.long(), head_dim)  # [Hkv, R]
    nope = complement(keep, head_dim)  # [Hkv, D - R]
    wk = w_k.double().reshape(num_kv_heads, head_dim, -1)
    heads = torch.arange(num_kv_heads)[:, None]
    w_k_nope = wk[heads, nope].reshape(-1, w_k.shape[1])
    joint = torch.cat([w_k_nope, w_v.double()])
    max_rank = min(joint.shape)
    if not 1 <= rank <= max_rank:
        raise ValueError(f"latent_rank={rank} must be within 1..{max_rank} (min of K/V rows and hidden size)")
    if inputs is None:
        u, s, vh = torch.linalg.svd(joint, full_matrices=False)
        up, down = u[:, :rank] * s[:rank], vh[:rank]
    else:
        if inputs.shape[1] != joint.shape[1]:
            raise ValueError(f"calibration inputs have width {inputs.shape[1]}, the projections {joint.shape[1]}")
        white = whitening(inputs.to(joint.device))
        u, s, vh = torch.linalg.svd(joint @ white, full_matrices=False)
        up = u[:, :rank] * s[:rank]
        down = torch.linalg.solve_triangular(white, vh[:rank], upper=False, left=False)  # V_r^T S^-1
    approx = up @ down
    n_k = w_k_nope.shape[0]
    return MlaConversion(
        down=down.float(),
        up_k=up[:n_k].float(),
        up_v=up[n_k:].float(),
        k_rope=wk[heads, keep].reshape(-1, w_k.shape[1]).float(),
        rope_index=keep,
        nope_index=nope,
        rank=rank,
        error_k=_relative_error(w_k_nope, approx[:n_k]),
        error_v=_relative_error(w_v.double(), approx[n_k:]),
        error=_relative_error(joint, approx),
    )


def reconstruct_k(conv: MlaConversion, num_kv_heads: int) -> torch.Tensor:
    """The approximate W_K [Hkv*D, hidden]: exact RoPE rows and up_k @ down elsewhere, in head order."""
    head_dim = conv.rope_index.shape[1] + conv.nope_index.shape[1]
    hidden = conv.down.shape[1]
    w = torch.empty(num_kv_heads, head_dim, hidden)
    heads = torch.arange(num_kv_heads)[:, None]
    w[heads, conv.nope_index] = (conv.up_k @ conv.down).reshape(num_kv_heads, -1, hidden)
    w[heads, conv.rope_index] = conv.k_rope.reshape(num_kv_heads, -1, hidden)
    return w.reshape(num_kv_heads * head_dim, hidden)


def reconstruct_v(conv: MlaConversion) -> torch.Tensor:
    """The approximate W_V [Hkv*Dv, hidden]."""
    return conv.up_v @ conv.down
