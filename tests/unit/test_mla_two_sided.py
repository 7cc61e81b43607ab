"""MLA conversion weighted on both sides: inputs by their covariance, keys by the queries' per-RoPE-pair
energy, values through o_proj (strategies/mla/weighting.py, svd._two_sided)."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.rotary.reference import rotary_reference
from kvpilot.engine.strategies.mla.svd import factorize_kv, reconstruct_k, reconstruct_v
from kvpilot.engine.strategies.mla.weighting import key_pair_energy, value_grams

pytestmark = pytest.mark.unit

HEADS, DIM, HIDDEN, QUERY_HEADS = 4, 16, 64, 8
INV_FREQ = 1.0 / (10000 ** (torch.arange(0, DIM, 2).double() / DIM))


def layer(seed: int = 0) -> dict[str, torch.Tensor]:
    """A random GQA layer (8 query heads on 4 KV heads) whose queries load a few RoPE pairs and whose
    o_proj reads a few value directions, as trained layers do; inputs with a few dominant directions."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.ones(HIDDEN)
    scales[:8] = 6.0
    pair_gain = torch.ones(DIM // 2)
    pair_gain[torch.randperm(DIM // 2, generator=gen)[:2]] = 12.0
    q_gain = torch.cat([pair_gain, pair_gain]).repeat(QUERY_HEADS)[:, None]
    o_gain = torch.ones(DIM)
    o_gain[:3] = 10.0
    return {
        "w_k": torch.randn(HEADS * DIM, HIDDEN, generator=gen),
        "w_v": torch.randn(HEADS * DIM, HIDDEN, generator=gen),
        "w_q": torch.randn(QUERY_HEADS * DIM, HIDDEN, generator=gen) * q_gain,
        "w_o": torch.randn(HIDDEN, QUERY_HEADS * DIM, generator=gen) * o_gain.repeat(QUERY_HEADS),
        "x": torch.randn(1200, HIDDEN, generator=gen) * scales,
    }


def weights_of(t: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = (x @ t["w_q"].T).view(x.shape[0], QUERY_HEADS, DIM)
    return key_pair_energy(q, HEADS), value_grams(t["w_o"], HEADS, DIM)


def rotate(rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """rows [T, heads, D] rotated by RoPE at positions [T]."""
    out, _ = rotary_reference(positions, INV_FREQ.float(), rows, rows[:, :1])
    return out


def score_error(t: dict[str, torch.Tensor], w_k_hat: torch.Tensor, x: torch.Tensor) -> float:
    """Relative error of q_t . k_s (both after RoPE) over random query/key pairs of held-out tokens."""
    n, gen = x.shape[0], torch.Generator().manual_seed(1)
    qt, ks = torch.randint(0, n, (4000,), generator=gen), torch.randint(0, n, (4000,), generator=gen)
    pos_q, pos_k = torch.randint(0, 2048, (4000,), generator=gen), torch.randint(0, 2048, (4000,), generator=gen)
    q = rotate((x[qt] @ t["w_q"].T).view(-1, QUERY_HEADS, DIM), pos_q).view(-1, HEADS, QUERY_HEADS // HEADS, DIM)

    def scores(w: torch.Tensor) -> torch.Tensor:
        k = rotate((x[ks] @ w.T).view(-1, HEADS, DIM), pos_k)
        return torch.einsum("nhsd,nhd->nhs", q, k)

    exact = scores(t["w_k"])
    return float((scores(w_k_hat) - exact).norm() / exact.norm())


def output_error(t: dict[str, torch.Tensor], w_v_hat: torch.Tensor, x: torch.Tensor) -> float:
    """Relative error of the values as o_proj sees them (each query head reads its KV head's values)."""

    def out(w: torch.Tensor) -> torch.Tensor:
        v = (x @ w.T).view(-1, HEADS, 1, DIM).expand(-1, -1, QUERY_HEADS // HEADS, -1)
        return v.reshape(x.shape[0], -1) @ t["w_o"].T

    exact = out(t["w_v"])
    return float((out(w_v_hat) - exact).norm() / exact.norm())


@pytest.mark.parametrize("rank", [12, 24])
def test_two_sided_errors_through_scores_and_o_proj_are_below_input_only(rank: int) -> None:
    t = layer()
    fit, held = t["x"][:800], t["x"][800:]
    energy, grams = weights_of(t, fit)
    input_only = factorize_kv(t["w_k"], t["w_v"], HEADS, rank, inputs=fit)
    two_sided = factorize_kv(t["w_k"], t["w_v"], HEADS, rank, inputs=fit, key_energy=energy, grams=grams)
    s_in, s_two = (score_error(t, reconstruct_k(c, HEADS), held) for c in (input_only, two_sided))
    o_in, o_two = (output_error(t, reconstruct_v(c), held) for c in (input_only, two_sided))
    assert s_two < 0.9 * s_in and o_two < 0.8 * o_in, (s_in, s_two, o_in, o_two)
    # the weights themselves are fitted worse: the rank went where the other side looks
    assert two_sided.error > input_only.error


@pytest.mark.parametrize("balance", [0.25, 1.0, 4.0])
def test_two_sided_full_rank_reconstructs_exactly(balance: float) -> None:
    t = layer(seed=2)
    energy, grams = weights_of(t, t["x"])
    conv = factorize_kv(t["w_k"], t["w_v"], HEADS, HIDDEN, inputs=t["x"], key_energy=energy, grams=grams,
                        key_balance=balance)  # fmt: skip
    assert conv.error < 1e-6
    assert torch.allclose(reconstruct_k(conv, HEADS), t["w_k"], atol=1e-4)
    assert torch.allclose(reconstruct_v(conv), t["w_v"], atol=1e-4)


def test_key_weight_commutes_with_rope() -> None:
    """Factorising keys rotated by RoPE at some position gives the rotated factorisation: scores at any
    positions are the same whichever comes first. A per-dim weight that is not constant over each
    rotate-half pair does not commute, and the scores then differ."""
    t = layer(seed=3)
    energy, grams = weights_of(t, t["x"])
    assert torch.equal(energy[:, : DIM // 2], energy[:, DIM // 2 :])
    offset = torch.tensor([37])

    def rotated_weight(w: torch.Tensor) -> torch.Tensor:  # R_offset applied to every key head's rows
        rows = w.view(HEADS, DIM, HIDDEN).permute(2, 0, 1)  # [hidden, heads, D]: one "token" per input dim
        return rotate(rows, offset.expand(HIDDEN)).permute(1, 2, 0).reshape(HEADS * DIM, HIDDEN)

    def gap(key_energy: torch.Tensor) -> float:
        first = factorize_kv(t["w_k"], t["w_v"], HEADS, 16, inputs=t["x"], key_energy=key_energy, grams=grams)
        then = factorize_kv(rotated_weight(t["w_k"]), t["w_v"], HEADS, 16, inputs=t["x"], key_energy=key_energy,
                            grams=grams)  # fmt: skip
        gen = torch.Generator().manual_seed(4)
        x, pos = t["x"][:50], torch.randint(0, 2048, (50,), generator=gen)
        q = rotate(torch.randn(50, HEADS, DIM, generator=gen), pos)
        k_first = rotate((x @ rotated_weight(reconstruct_k(first, HEADS)).T).view(50, HEADS, DIM), pos)
        k_then = rotate((x @ reconstruct_k(then, HEADS).T).view(50, HEADS, DIM), pos)
        s_first, s_then = ((q[:, None] * k[None]).sum(-1) for k in (k_first, k_then))
        return float((s_first - s_then).norm() / s_first.norm())

    assert gap(energy) < 1e-4
    uneven = energy.clone()
    uneven[:, : DIM // 2] *= 8.0  # one dim of each pair weighted more: no longer rotation-invariant
    assert gap(uneven) > 1e-2


def test_weights_reject_mismatched_shapes() -> None:
    t = layer()
    energy, grams = weights_of(t, t["x"])
    with pytest.raises(ValueError, match="key_energy"):
        factorize_kv(t["w_k"], t["w_v"], HEADS, 8, inputs=t["x"], key_energy=energy[:2], grams=grams)
    with pytest.raises(ValueError, match="grams"):
        factorize_kv(t["w_k"], t["w_v"], HEADS, 8, inputs=t["x"], key_energy=energy, grams=grams[:, :8, :8])
    with pytest.raises(ValueError, match="multiple of Hkv"):
        key_pair_energy(torch.randn(10, 6, DIM), 4)
