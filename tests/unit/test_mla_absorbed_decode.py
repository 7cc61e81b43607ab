"""Absorbed decode of the partial-RoPE MLA conversion (strategies/mla/absorbed.py) against decompress-then-attend.

The reference builds every cached token's key [W_UK c + b_K ; k_rope] and value W_UV c + b_V per KV
head and runs softmax attention per sequence, as the prefill path does: the absorbed path must
agree to fp32 rounding (1e-5 relative) over a paged cache with shuffled blocks, uneven context
lengths (1 to 70 tokens) and GQA groups, and the K bias must drop out (softmax shift). Also the rope
pair rules (rope_select.py) and the per-head index bookkeeping of svd.py.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.strategies.mla.absorbed import (
    absorb_query,
    latent_attention_torch,
    project_values,
)
from kvpilot.engine.strategies.mla.decode import DecodePlanner
from kvpilot.engine.strategies.mla.rope_select import (
    high_frequency_pairs,
    norm_pairs,
    resolve_rule,
    turn_pairs,
    turn_weights,
)
from kvpilot.engine.strategies.mla.svd import factorize_kv, reconstruct_k

pytestmark = pytest.mark.unit

PAGE = 8


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def paged(lens: list[int], width: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache [blocks, PAGE, width] of random rows (stale rows past each context too) and block tables
    of shuffled blocks, -1 past each sequence's blocks."""
    num_blocks = sum(-(-n // PAGE) for n in lens) + 3
    cache = torch.randn(num_blocks, PAGE, width, generator=gen)
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.full((len(lens), max(-(-n // PAGE) for n in lens) + 1), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(lens):
        count = -(-n // PAGE)
        tables[b, :count] = perm[used : used + count]
        used += count
    return cache, tables


class Setup:
    """Random partial-RoPE layer weights and a paged cache of rows [c (r) ; k_rope (Hkv*R)]."""

    def __init__(self, lens: list[int], kv_heads: int, group: int, head_dim: int, rope: int, rank: int,
                 value_dim: int = 12, seed: int = 0) -> None:  # fmt: skip
        gen = torch.Generator().manual_seed(seed)
        self.lens, self.kv_heads, self.heads, self.rope, self.rank = lens, kv_heads, kv_heads * group, rope, rank
        self.nope = head_dim - rope
        self.up_k = torch.randn(kv_heads * self.nope, rank, generator=gen) / rank**0.5
        self.k_bias = torch.randn(kv_heads * self.nope, generator=gen)
        self.up_v = torch.randn(kv_heads * value_dim, rank, generator=gen) / rank**0.5
        self.v_bias = torch.randn(kv_heads * value_dim, generator=gen)
        self.cache, self.tables = paged(lens, rank + kv_heads * rope, gen)
        self.q = torch.randn(len(lens), self.heads, head_dim, generator=gen)
        self.scale = head_dim**-0.5
        self.context = torch.tensor(lens, dtype=torch.int32)

    def reference(self) -> torch.Tensor:
        """Decompress each sequence's keys and values, attend: [B, H, Dv]."""
        outs = []
        group = self.heads // self.kv_heads
        for b, n in enumerate(self.lens):
            blocks = self.tables[b, : -(-n // PAGE)].long()
            rows = self.cache[blocks].reshape(-1, self.cache.shape[2])[:n].double()
            c, rope = rows[:, : self.rank], rows[:, self.rank :]
            k_nope = (c @ self.up_k.double().T + self.k_bias.double()).view(n, self.kv_heads, self.nope)
            key = torch.cat([k_nope, rope.view(n, self.kv_heads, self.rope)], dim=-1)
            value = (c @ self.up_v.double().T + self.v_bias.double()).view(n, self.kv_heads, -1)
            key = key.repeat_interleave(group, dim=1)  # HF repeat_kv: head h reads KV head h // group
            value = value.repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,nhd->hn", self.q[b].double(), key) * self.scale
            outs.append(torch.einsum("hn,nhv->hv", scores.softmax(dim=-1), value))
        return torch.stack(outs)

    def absorbed(self) -> torch.Tensor:
        q_nope, q_rope = self.q.split([self.nope, self.rope], dim=-1)
        plan = DecodePlanner(torch.ones(4)).plan(self.tables, self.context, PAGE, torch.float32)
        rows = plan.gather(self.cache)
        o = latent_attention_torch(absorb_query(q_nope, self.up_k, self.kv_heads), q_rope, rows, plan,
                                   self.scale, self.kv_heads)  # fmt: skip
        return project_values(o, self.up_v, self.v_bias, self.kv_heads)


@pytest.mark.parametrize(
    ("lens", "kv_heads", "group", "rope"),
    [([5, 17, 70, 1], 2, 3, 4), ([9, 9], 4, 1, 2), ([33, 8, 16], 1, 4, 0), ([3, 40], 2, 2, 16)],
)
def test_absorbed_decode_equals_decompressing_attention(lens, kv_heads, group, rope) -> None:
    s = Setup(lens, kv_heads, group, head_dim=16, rope=rope, rank=10)
    want = s.reference()
    got = s.absorbed()
    assert got.shape == want.shape == (len(lens), kv_heads * group, 12)
    assert rel_err(got, want) < 1e-5


def test_norm_pairs_keep_the_pairs_carrying_the_most_magnitude() -> None:
    gen = torch.Generator().manual_seed(2)
    q = 0.01 * torch.randn(50, 4, 16, generator=gen)
    k = 0.01 * torch.randn(50, 2, 16, generator=gen)
    q[:, :2, [5, 13]] += 3.0  # pair 5 = dims (5, 13), loud in KV head 0's queries
    k[:, 0, [5, 13]] += 3.0
    q[:, 2:, [2, 10, 7, 15]] += 3.0  # KV head 1: pairs 2 and 7
    k[:, 1, [2, 10, 7, 15]] += 3.0
    pairs = norm_pairs(q, k, rope_dims=4)
    assert pairs.tolist()[1] == [2, 7] and 5 in pairs.tolist()[0]
    assert high_frequency_pairs(2, 4).tolist() == [[0, 1], [0, 1]]


def test_turn_prefers_a_rotating_pair_to_a_louder_one_that_barely_turns() -> None:
    inv_freq = 10000.0 ** (-torch.arange(8) / 8)  # head_dim 16: pair 0 turns fastest, pair 7 slowest
    weights = turn_weights(inv_freq, 2048)
    assert weights[0] > 0.99 and weights[6] < 0.8 and weights[7] < 0.3  # 0.65 rad over 2048 tokens
    gen = torch.Generator().manual_seed(4)
    q, k = 0.01 * torch.randn(40, 2, 16, generator=gen), 0.01 * torch.randn(40, 1, 16, generator=gen)
    q[:, :, [7, 15]] += 1.5  # pair 7: loudest, but turns 0.65 rad over 2048 tokens
    k[:, :, [7, 15]] += 1.5
    q[:, :, [1, 9]] += 1.0  # pair 1: quieter, turns many times
    k[:, :, [1, 9]] += 1.0
    assert norm_pairs(q, k, rope_dims=2).tolist() == [[7]]
    assert turn_pairs(q, k, 2, inv_freq, 2048).tolist() == [[1]]


def test_pair_rules_resolve_and_refuse() -> None:
    assert resolve_rule("auto", calibrated=True) == "turn" and resolve_rule("auto", calibrated=False) == "high"
    for rule in ("norm", "turn"):
        with pytest.raises(ValueError, match="conversion_calibration"):
            resolve_rule(rule, calibrated=False)
    with pytest.raises(ValueError, match="auto, high, norm, turn"):
        resolve_rule("low", calibrated=True)


def test_per_head_pairs_keep_those_rows_exact() -> None:
    gen = torch.Generator().manual_seed(3)
    w_k, w_v = torch.randn(2 * 16, 48, generator=gen), torch.randn(2 * 16, 48, generator=gen)
    conv = factorize_kv(w_k, w_v, 2, rank=20, rope_dims=4, pairs=torch.tensor([[6, 1], [3, 7]]))
    assert conv.rope_index.tolist() == [[1, 6, 9, 14], [3, 7, 11, 15]]
    assert conv.nope_index.shape == (2, 12) and not set(conv.nope_index[0].tolist()) & {1, 6, 9, 14}
    k_hat = reconstruct_k(conv, 2).view(2, 16, 48)
    for head in range(2):
        keep = conv.rope_index[head]
        torch.testing.assert_close(k_hat[head, keep], w_k.view(2, 16, 48)[head, keep])
    with pytest.raises(ValueError, match="pairs must be"):
        factorize_kv(w_k, w_v, 2, rank=20, rope_dims=4, pairs=torch.tensor([[8, 1], [3, 7]]))
