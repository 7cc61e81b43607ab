"""Batched, V-absorbed decode of the MLA conversion against the decompress-everything decode it replaced."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvpilot.engine.models.layers import RotaryEmbedding
from kvpilot.engine.strategies.mla import decode as mla_conversion_decode
from kvpilot.engine.strategies.mla.decode import DecodePlanner, converted_mla_decode

pytestmark = pytest.mark.unit


def decompress_everything(
    q, cache, block_tables, context_lens, up_k, k_bias, up_v, v_bias, rotary, hkv, scale
):
    """The former decode: per sequence, rebuild its whole context's K (with RoPE) and V, repeat KV heads, SDPA."""
    outs = []
    for b, n in enumerate(context_lens.tolist()):
        page = cache.shape[1]
        rows = cache[block_tables[b, : -(-n // page)].long()].reshape(-1, cache.shape[2])[:n]
        k = F.linear(rows, up_k, k_bias).view(n, hkv, -1)
        v = F.linear(rows, up_v, v_bias).view(n, hkv, -1)
        k, _ = rotary(torch.arange(n), k, k[:, :1])
        group = q.shape[1] // hkv
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(q[b, :, None], k.transpose(0, 1), v.transpose(0, 1), scale=scale)
        outs.append(o[:, 0])
    return torch.stack(outs)


def random_case(lens, heads, hkv, dim=16, rank=12, page=4, bias=True, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    blocks_per_seq = [-(-n // page) for n in lens]
    num_blocks = sum(blocks_per_seq) + 3
    cache = torch.full((num_blocks, page, rank), float("nan"), dtype=dtype)  # unwritten slots are poison
    width = -(-max(blocks_per_seq) // 16) * 16  # the runner pads table widths to a multiple of 16
    tables = torch.full((len(lens), width), -1, dtype=torch.int32)
    free = torch.randperm(num_blocks, generator=gen).tolist()  # scattered, unordered blocks
    for b, n in enumerate(lens):
        ids = [free.pop() for _ in range(blocks_per_seq[b])]
        tables[b, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        slots = torch.tensor([i * page + t for i in ids for t in range(page)])[:n]
        cache.view(-1, rank)[slots] = randn(n, rank)
    weights = dict(
        up_k=randn(hkv * dim, rank), k_bias=randn(hkv * dim) if bias else None,
        up_v=randn(hkv * dim, rank), v_bias=randn(hkv * dim) if bias else None,
    )  # fmt: skip
    q = randn(len(lens), heads, dim)
    return q, cache, tables, torch.tensor(lens, dtype=torch.int32), weights


@pytest.mark.parametrize(
    ("lens", "heads", "hkv", "bias"),
    [
        ([1], 4, 4, False),
        ([15], 4, 2, True),
        ([63, 1, 300, 16], 8, 2, True),  # mixed lengths: padding masked, NaN slots never read into the output
        ([17, 17, 17], 6, 3, False),  # equal lengths: no mask at all
        ([5, 40], 4, 1, True),  # MQA
    ],
)
def test_batched_decode_equals_decompressing_everything(lens, heads, hkv, bias) -> None:
    q, cache, tables, context_lens, w = random_case(lens, heads, hkv, bias=bias)
    rotary = RotaryEmbedding(16, 10000.0, None)
    scale = 16**-0.5
    expected = decompress_everything(q, cache, tables, context_lens, **w, rotary=rotary, hkv=hkv, scale=scale)
    plan = DecodePlanner(rotary.inv_freq).plan(tables, context_lens, cache.shape[1], q.dtype)
    got = converted_mla_decode(q, plan.gather(cache), plan, w["up_k"], w["k_bias"], w["up_v"], w["v_bias"],
                               hkv, scale)  # fmt: skip
    assert got.shape == expected.shape and torch.isfinite(got).all()
    err = (got - expected).norm() / expected.norm()
    assert err < 1e-12, f"relative error {err:.2e}"


def test_float32_matches_within_rounding() -> None:
    q, cache, tables, context_lens, w = random_case([200, 77, 1], 8, 2, dtype=torch.float32, seed=3)
    rotary = RotaryEmbedding(16, 10000.0, None)
    expected = decompress_everything(q, cache, tables, context_lens, **w, rotary=rotary, hkv=2, scale=0.25)
    plan = DecodePlanner(rotary.inv_freq).plan(tables, context_lens, cache.shape[1], q.dtype)
    got = converted_mla_decode(q, plan.gather(cache), plan, *w.values(), 2, 0.25)
    assert float((got - expected).norm() / expected.norm()) < 1e-5


def test_plan_is_reused_within_a_step_and_rebuilt_for_the_next() -> None:
    _, _, tables, context_lens, _ = random_case([9, 30], 4, 2)
    planner = DecodePlanner(RotaryEmbedding(16, 10000.0, None).inv_freq)
    first = planner.plan(tables, context_lens, 4, torch.float64)
    assert planner.plan(tables, context_lens, 4, torch.float64) is first  # the other layers of the step
    grown = context_lens + 1  # next step: new tensors
    second = planner.plan(tables.clone(), grown, 4, torch.float64)
    assert second is not first and second.length == 31 and second.cos.shape == (8, 31)
    assert torch.equal(second.cos[:, :30], first.cos)
    assert second.invalid is not None and second.invalid[0, 10:].all() and not second.invalid[0, :10].any()


@pytest.mark.parametrize(
    "budget", [32 * 300 * 2, 32 * 64, 32 * 7, 1]
)  # several sequences / one / a few positions
def test_tiled_keys_equal_one_tile(monkeypatch, budget: int) -> None:
    """Keys decompressed a tile at a time (a memory bound) give the same output as all at once."""
    q, cache, tables, context_lens, w = random_case([63, 1, 300, 16], 8, 2, seed=5)
    rotary = RotaryEmbedding(16, 10000.0, None)
    plan = DecodePlanner(rotary.inv_freq).plan(tables, context_lens, cache.shape[1], q.dtype)
    whole = converted_mla_decode(q, plan.gather(cache), plan, *w.values(), 2, 0.25)
    monkeypatch.setattr(mla_conversion_decode, "_tile_elements", lambda device: budget)
    tiled = converted_mla_decode(q, plan.gather(cache), plan, *w.values(), 2, 0.25)
    torch.testing.assert_close(tiled, whole, rtol=1e-12, atol=1e-12)
