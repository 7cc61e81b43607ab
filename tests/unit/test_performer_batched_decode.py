"""PerformerAttention's batched decode against its per-sequence loop (the reference it replaced).

A layer over a random paged cache (blocks shuffled, so tables are not contiguous) and a random summary
pool; one decode step for sequences shorter than, equal to and longer than the window, run once with
`batched_decode = False` (the per-sequence `_attend` loop) and once batched: outputs and the state pool
after the fold must agree. Also mixed prefill + decode steps, decodes on the exact path beside
approximate ones, a 16-bit cache, and a window covering the context (then exact softmax attention).
"""

from __future__ import annotations

import copy

import pytest
import torch

from kvpilot.engine.context import Context, reset_context, set_context
from kvpilot.engine.layers.attention import Attention
from kvpilot.engine.strategies.linear.attention import PerformerAttention
from kvpilot.engine.strategies.linear.features import draw_features, exact_causal_attention

pytestmark = pytest.mark.unit

HEADS, KV_HEADS, D, BS = 4, 2, 16, 4


def make_layer(window: int, num_blocks: int, dtype: torch.dtype, gen: torch.Generator) -> PerformerAttention:
    w = torch.stack([draw_features(24, D, gen) for _ in range(KV_HEADS)])
    layer = PerformerAttention(Attention(HEADS, KV_HEADS, D, D**-0.5), window, w)
    layer.k_cache = (0.5 * torch.randn(num_blocks, BS, KV_HEADS, D, generator=gen)).to(dtype)
    layer.v_cache = torch.randn(num_blocks, BS, KV_HEADS, D, generator=gen).to(dtype)
    layer.state_pool = torch.rand(8, *layer.state_shape, generator=gen)  # positive, like a real summary
    return layer


def tables_for(lens: list[int], num_blocks: int, gen: torch.Generator) -> torch.Tensor:
    """Disjoint shuffled blocks per sequence, -1 padded to a common width."""
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(-(-n // BS) for n in lens) + 1
    table = torch.full((len(lens), width), -1, dtype=torch.int32)
    for i, n in enumerate(lens):
        need = -(-n // BS)
        table[i, :need] = torch.tensor(perm[:need], dtype=torch.int32)
        perm = perm[need:]
    return table


def slots_of(table: torch.Tensor, starts: list[int], lens: list[int]) -> torch.Tensor:
    """Cache slots of positions start..len-1 of each row, concatenated."""
    out = [
        int(table[i, p // BS]) * BS + p % BS
        for i, (s, n) in enumerate(zip(starts, lens, strict=True))
        for p in range(s, n)
    ]
    return torch.tensor(out, dtype=torch.long)


def run_step(layer: PerformerAttention, ctx: Context, q, k, v, batched: bool) -> tuple[torch.Tensor, ...]:
    layer = copy.deepcopy(layer)
    layer.batched_decode = batched
    set_context(ctx)
    try:
        out = layer(q, k, v)
    finally:
        reset_context()
    return out, layer.state_pool, layer.k_cache


def decode_context(
    table: torch.Tensor, lens: list[int], slots: list[int], exact: list[bool] | None = None
) -> Context:
    return Context(
        slot_mapping=slots_of(table, [n - 1 for n in lens], lens),
        decode_block_tables=table,
        decode_context_lens=torch.tensor(lens, dtype=torch.int32),
        decode_linear_slots=torch.tensor(slots, dtype=torch.int32),
        linear_exact=exact,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 6, 13])
def test_batched_decode_equals_the_per_sequence_loop(window: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(window)
    lens = [1, 5, 6, 7, 13, 14, 30]  # below, at and beyond the window; position 0 decoding too
    layer = make_layer(window, 40, dtype, gen)
    table = tables_for(lens, 40, gen)
    q = torch.randn(len(lens), HEADS, D, generator=gen).to(dtype)
    k = (0.5 * torch.randn(len(lens), KV_HEADS, D, generator=gen)).to(dtype)
    v = torch.randn(len(lens), KV_HEADS, D, generator=gen).to(dtype)
    ctx = decode_context(table, lens, [6, 0, 3, 5, 1, 2, 4])
    ref, ref_state, ref_cache = run_step(layer, ctx, q, k, v, batched=False)
    got, state, cache = run_step(layer, ctx, q, k, v, batched=True)
    assert got.dtype == q.dtype and torch.equal(cache, ref_cache)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(state, ref_state, atol=1e-5, rtol=1e-5)
    assert not torch.equal(state, layer.state_pool) or window > max(lens), "a key left some window"


def test_many_decode_steps_keep_summaries_equal() -> None:
    """Ten steps in a row: the folds accumulate identically."""
    gen = torch.Generator().manual_seed(7)
    lens0 = [3, 8, 20]
    layer = make_layer(5, 40, torch.float32, gen)
    table = tables_for([n + 10 for n in lens0], 40, gen)
    ref_layer, got_layer = copy.deepcopy(layer), copy.deepcopy(layer)
    ref_layer.batched_decode = False
    for step in range(10):
        lens = [n + step for n in lens0]
        q, k, v = (torch.randn(3, h, D, generator=gen) for h in (HEADS, KV_HEADS, KV_HEADS))
        ctx = decode_context(table, lens, [2, 0, 1])
        outs = []
        for lay in (ref_layer, got_layer):
            set_context(ctx)
            try:
                outs.append(lay(q, k, v))
            finally:
                reset_context()
        torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_layer.state_pool, ref_layer.state_pool, atol=1e-5, rtol=1e-5)


def test_mixed_step_with_exact_path_decodes() -> None:
    """Two prefill chunks, then four decodes of which one is on the exact path (no summary, whole context)."""
    gen = torch.Generator().manual_seed(11)
    window = 4
    layer = make_layer(window, 60, torch.float32, gen)
    prefill_lens, chunk = [9, 12], [3, 12]  # context after the chunk, chunk length
    decode_lens = [2, 10, 17, 25]
    lens = prefill_lens + decode_lens
    table = tables_for(lens, 60, gen)
    starts = [n - c for n, c in zip(prefill_lens, chunk, strict=True)] + [n - 1 for n in decode_lens]
    n = sum(chunk) + len(decode_lens)
    q, k, v = (torch.randn(n, h, D, generator=gen) for h in (HEADS, KV_HEADS, KV_HEADS))
    ctx = Context(
        slot_mapping=slots_of(table, starts, lens),
        num_prefill_tokens=sum(chunk),
        block_tables=table[:2],
        cu_seqlens_q=torch.tensor([0, chunk[0], sum(chunk)], dtype=torch.int32),
        context_lens=torch.tensor(prefill_lens, dtype=torch.int32),
        decode_block_tables=table[2:],
        decode_context_lens=torch.tensor(decode_lens, dtype=torch.int32),
        linear_slots=torch.tensor([5, 1], dtype=torch.int32),
        decode_linear_slots=torch.tensor([0, 7, 3, 2], dtype=torch.int32),
        linear_exact=[False, False, False, True, False, False],
    )
    ref, ref_state, _ = run_step(layer, ctx, q, k, v, batched=False)
    got, state, _ = run_step(layer, ctx, q, k, v, batched=True)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, ref_state, atol=1e-5, rtol=1e-5)
    assert torch.equal(state[7], layer.state_pool[7]), "the exact-path sequence folds nothing"


def test_window_covering_the_context_is_softmax_attention() -> None:
    """Batched decode with W >= every context: exactly softmax attention over the cached keys."""
    gen = torch.Generator().manual_seed(5)
    lens = [1, 9, 22]
    layer = make_layer(64, 40, torch.float32, gen)
    table = tables_for(lens, 40, gen)
    q, k, v = (torch.randn(3, h, D, generator=gen) for h in (HEADS, KV_HEADS, KV_HEADS))
    layer.state_pool.zero_()
    ctx = decode_context(table, lens, [0, 1, 2])
    layer.batched_decode = True
    set_context(ctx)
    try:
        got = layer(q, k, v)
    finally:
        reset_context()
    assert torch.equal(layer.state_pool, torch.zeros_like(layer.state_pool))
    for i, n in enumerate(lens):
        index = slots_of(table[i : i + 1], [0], [n])
        keys = layer.k_cache.view(-1, KV_HEADS, D)[index].repeat_interleave(2, 1)
        values = layer.v_cache.view(-1, KV_HEADS, D)[index].repeat_interleave(2, 1)
        assert torch.equal(keys[-1], k[i].repeat_interleave(2, 0)), "the step's key was stored first"
        full_q = torch.cat([torch.zeros(n - 1, HEADS, D), q[i : i + 1]])  # the query at position n - 1
        want = exact_causal_attention(full_q, keys, values, D**-0.5)[-1]
        torch.testing.assert_close(got[i], want, atol=1e-5, rtol=1e-5)
