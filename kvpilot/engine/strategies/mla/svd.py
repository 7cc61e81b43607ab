"""MLA conversion: factorise K/V projections into one shared latent of rank r (MHA2MLA / Palu style).

W = [W_K(nope rows); W_V] [out, hidden] = U S V^T; keep r: down = V_r^T [r, hidden] (shared, the
cached latent is c = down x), up = U_r S_r, split into up_K and up_V. Truncated SVD is the best rank-r
approximation in Frobenius norm (Eckart-Young), so the error falls monotonically with r and is zero
at full rank. With calibration inputs the fit is weighted by them (`whitening`) and, given the output-side
weights of weighting.py, by what the queries and o_proj make of the error (`_two_sided`). RoPE: `rope_dims` dims per KV head (whole rotate-half pairs (i, i + D/2): by default
the highest-frequency ones, or per head those `pairs` picks, strategies/mla/rope_select.py) stay
un-factorised and are cached exactly, post-RoPE; the others go through the latent. See
docs/strategies.md for the two ways the engine uses this (exact RoPE on every dim, or partial RoPE
with absorbed decode).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvpilot.engine.strategies.mla.weighting import key_factor, value_factor


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
    index = index.cpu()
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
    cov += damping * cov.diagonal().mean().clamp_min(1e-12) * torch.eye(
        cov.shape[0], dtype=cov.dtype, device=cov.device
    )
    return torch.linalg.cholesky(cov)


def factorize_kv(
    w_k: torch.Tensor, w_v: torch.Tensor, num_kv_heads: int, rank: int, rope_dims: int = 0,
    inputs: torch.Tensor | None = None, pairs: torch.Tensor | None = None, key_energy: torch.Tensor | None = None,
    grams: torch.Tensor | None = None, key_balance: float = 1.0,
) -> MlaConversion:
    """w_k [Hkv*D, hidden], w_v [Hkv*Dv, hidden] -> shared-latent factorisation of rank `rank` (fp32).

    `inputs` [T, hidden]: calibration activations of the layer; the factorisation then minimises the
    error of the K/V the layer produces on them rather than of the weights (`whitening`).
    `pairs` [Hkv, rope_dims/2]: the rotate-half pairs each KV head keeps exact (default: the
    highest-frequency ones, 0..rope_dims/2-1, for every head).
    `key_energy` [Hkv, D] / `grams` [Hkv, Dv, Dv] (weighting.py): weight the output side too, keys by
    the queries' per-pair energy, values through o_proj (two-sided, `_two_sided`); each weighted block
    is scaled to unit norm first and the keys' then by sqrt(`key_balance`)."""
    head_dim = w_k.shape[0] // num_kv_heads
    if w_k.shape[0] != num_kv_heads * head_dim or w_v.shape[0] % num_kv_heads:
        raise ValueError(f"K/V rows {w_k.shape[0]}, {w_v.shape[0]} are not multiples of Hkv={num_kv_heads}")
    check_rope_dims(head_dim, rope_dims)
    if pairs is None:
        pairs = torch.arange(rope_dims // 2).expand(num_kv_heads, -1)
    pairs = pairs.cpu()  # index tensors stay on the host (they index the weights on any device)
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
    if inputs is not None and inputs.shape[1] != joint.shape[1]:
        raise ValueError(f"calibration inputs have width {inputs.shape[1]}, the projections {joint.shape[1]}")
    white = None if inputs is None else whitening(inputs.to(joint.device))
    n_k = w_k_nope.shape[0]
    if key_energy is not None or grams is not None:
        left_k = torch.ones(n_k, dtype=joint.dtype, device=joint.device)
        if key_energy is not None:
            if key_energy.shape != (num_kv_heads, head_dim):
                raise ValueError(f"key_energy is {tuple(key_energy.shape)}; expected [Hkv={num_kv_heads}, D={head_dim}]")
            left_k = key_factor(key_energy.to(joint.device))[heads, nope].reshape(-1)
        up, down = _two_sided(joint, n_k, num_kv_heads, rank, left_k, grams, white, key_balance)
    elif white is None:
        u, s, vh = torch.linalg.svd(joint, full_matrices=False)
        up, down = u[:, :rank] * s[:rank], vh[:rank]
    else:
        u, s, vh = torch.linalg.svd(joint @ white, full_matrices=False)
        up = u[:, :rank] * s[:rank]
        down = torch.linalg.solve_triangular(white, vh[:rank], upper=False, left=False)  # V_r^T S^-1
    approx = up @ down
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


def _two_sided(joint: torch.Tensor, n_k: int, num_kv_heads: int, rank: int, left_k: torch.Tensor,
               grams: torch.Tensor | None, white: torch.Tensor | None, key_balance: float
               ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """min ||L (joint - up down) S||_F over rank-`rank` up/down, L = blockdiag(diag(left_k), L_V per head)
    (L_V^T L_V = grams), S the input whitening (or I): the truncated SVD of L joint S, mapped back by
    L^-1 on the left (up) and S^-1 on the right (down)."""
    w_v = joint[n_k:]
    dv = w_v.shape[0] // num_kv_heads
    if grams is None:
        left_v = torch.eye(dv, dtype=joint.dtype, device=joint.device).expand(num_kv_heads, dv, dv)
    elif grams.shape != (num_kv_heads, dv, dv):
        raise ValueError(f"grams are {tuple(grams.shape)}; expected [Hkv={num_kv_heads}, Dv={dv}, Dv={dv}]")
    else:
        left_v = value_factor(grams.to(joint.device))
    a_k = left_k[:, None] * joint[:n_k]
    a_v = torch.einsum("hde,hen->hdn", left_v, w_v.reshape(num_kv_heads, dv, -1)).reshape(w_v.shape)
    if white is not None:
        a_k, a_v = a_k @ white, a_v @ white
    scale_k = key_balance**0.5 / float(a_k.norm()) if n_k and a_k.norm() > 0 else 1.0
    scale_v = 1.0 / float(a_v.norm()) if a_v.norm() > 0 else 1.0
    u, s, vh = torch.linalg.svd(torch.cat([a_k * scale_k, a_v * scale_v]), full_matrices=False)
    weighted = u[:, :rank] * s[:rank]
    up_k = weighted[:n_k] / (left_k[:, None] * scale_k)
    up_v = torch.linalg.solve_triangular(left_v, weighted[n_k:].reshape(num_kv_heads, dv, rank), upper=True)
    down = vh[:rank] if white is None else torch.linalg.solve_triangular(white, vh[:rank], upper=False, left=False)
    return torch.cat([up_k, up_v.reshape(-1, rank) / scale_v]), down


def reconstruct_k(conv: MlaConversion, num_kv_heads: int) -> torch.Tensor:
    """The approximate W_K [Hkv*D, hidden]: exact RoPE rows and up_k @ down elsewhere, in head order."""
    head_dim = conv.rope_index.shape[1] + conv.nope_index.shape[1]
    hidden = conv.down.shape[1]
    w = torch.empty(num_kv_heads, head_dim, hidden, dtype=conv.down.dtype, device=conv.down.device)
    heads = torch.arange(num_kv_heads)[:, None]
    w[heads, conv.nope_index] = (conv.up_k @ conv.down).reshape(num_kv_heads, -1, hidden)
    w[heads, conv.rope_index] = conv.k_rope.reshape(num_kv_heads, -1, hidden)
    return w.reshape(num_kv_heads * head_dim, hidden)


def reconstruct_v(conv: MlaConversion) -> torch.Tensor:
    """The approximate W_V [Hkv*Dv, hidden]."""
    return conv.up_v @ conv.down
