"""Properties of the capacity plan that hold for every model shape, strategy and GPU."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.planner import GpuSpec, KVStrategy, ModelShape, kv_footprint, plan_capacity

pytestmark = pytest.mark.unit
GIB = 1 << 30


@st.composite
def models(draw: st.DrawFn) -> ModelShape:
    kv_heads = draw(st.sampled_from([1, 2, 4, 8, 16]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    return ModelShape(
        model_type="llama", num_layers=draw(st.integers(1, 48)), hidden_size=heads * head_dim,
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=draw(st.integers(256, 16384)), vocab_size=draw(st.integers(1000, 150000)),
    )


@st.composite
def model_and_strategy(draw: st.DrawFn) -> tuple[ModelShape, KVStrategy]:
    model = draw(models())
    attention = draw(st.sampled_from(["native", "gqa", "mla", "linear"]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4, 8, 16) if model.num_kv_heads % g == 0]))
    rank = draw(st.integers(1, 2 * model.num_kv_heads * model.head_dim))
    return model, KVStrategy(
        attention=attention, kv_head_groups=groups, latent_rank=rank,
        kv_cache_dtype=draw(st.sampled_from(["auto", "bf16", "fp16", "int8", "fp8"])),
        block_size=draw(st.sampled_from([1, 8, 16, 32])), linear_window=draw(st.integers(0, 256)),
    )


def gpu(memory_gib: float) -> GpuSpec:
    return GpuSpec("TEST-GPU", int(memory_gib * GIB))


SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(model_and_strategy(), st.floats(8, 200), st.floats(8, 200), st.integers(1, 65536))
def test_more_memory_never_lowers_pool_or_concurrency(ms, mem_a, mem_b, seq) -> None:
    model, strategy = ms
    small, large = sorted((mem_a, mem_b))
    a = plan_capacity(model, strategy, gpu(small), max_seq_len=seq)
    b = plan_capacity(model, strategy, gpu(large), max_seq_len=seq)
    assert b.kv_pool_bytes >= a.kv_pool_bytes
    assert b.max_concurrency >= a.max_concurrency
    assert b.num_blocks >= a.num_blocks


@SETTINGS
@given(model_and_strategy(), st.integers(1, 65536), st.integers(1, 65536))
def test_longer_max_seq_len_never_raises_concurrency(ms, seq_a, seq_b) -> None:
    model, strategy = ms
    short, long_ = sorted((seq_a, seq_b))
    a = plan_capacity(model, strategy, gpu(80), max_seq_len=short)
    b = plan_capacity(model, strategy, gpu(80), max_seq_len=long_)
    assert b.per_request_peak_bytes >= a.per_request_peak_bytes
    assert b.max_concurrency <= a.max_concurrency


@SETTINGS
@given(model_and_strategy(), st.floats(20, 200), st.integers(1, 32768), st.floats(0.05, 1.0))
def test_admitted_requests_fit_in_the_pool_and_blocks(ms, mem, seq, watermark) -> None:
    model, strategy = ms
    plan = plan_capacity(model, strategy, gpu(mem), max_seq_len=seq, watermark=watermark)
    assert plan.kv_pool_bytes <= max(0, plan.free_bytes) * watermark
    serving = plan.kv_pool_bytes - plan.reserve_bytes  # beside the fallback reserve (lossy strategies)
    assert 0 <= plan.reserve_bytes <= plan.kv_pool_bytes * strategy.fallback_reserve
    assert plan.max_concurrency * plan.per_request_peak_bytes <= serving
    assert plan.feasible == (plan.max_concurrency >= 1)
    if plan.block_bytes:
        assert plan.num_blocks >= plan.max_concurrency * plan.blocks_per_request
        assert plan.num_blocks * plan.block_bytes <= plan.kv_pool_bytes
    if plan.feasible:
        # one more request would not fit
        assert (plan.max_concurrency + 1) * plan.per_request_peak_bytes > serving


@SETTINGS
@given(models(), st.integers(1, 16384))
def test_quantised_kv_costs_at_most_half_of_fp16_plus_scales(model, seq) -> None:
    fp16 = kv_footprint(model, KVStrategy(kv_cache_dtype="fp16"))
    for dtype in ("int8", "fp8"):
        q = kv_footprint(model, KVStrategy(kv_cache_dtype=dtype))
        scales = model.num_layers * 2 * model.num_kv_heads * 4 if dtype == "int8" else 0  # fp8's: per layer
        assert q.bytes_per_token == fp16.bytes_per_token // 2 + scales
        assert q.bytes_per_token < fp16.bytes_per_token or model.head_dim <= 8


@SETTINGS
@given(models(), st.sampled_from([1, 2, 4, 8, 16]))
def test_fewer_kv_head_groups_never_cost_more(model, groups) -> None:
    if model.num_kv_heads % groups:
        return
    merged = kv_footprint(model, KVStrategy(attention="gqa", kv_head_groups=groups)).bytes_per_token
    native = kv_footprint(model, KVStrategy()).bytes_per_token
    assert merged * model.num_kv_heads == native * groups


@SETTINGS
@given(models(), st.integers(1, 1 << 17))
def test_linear_attention_costs_native_plus_a_fixed_summary(model, tokens) -> None:
    if model.mla:
        return
    linear = kv_footprint(model, KVStrategy(attention="linear", linear_window=64))
    native = kv_footprint(model, KVStrategy())
    assert linear.sequence_bytes(tokens, 16) - native.sequence_bytes(tokens, 16) == (
        linear.fixed_bytes_per_sequence - native.fixed_bytes_per_sequence) > 0
