"""The planner models the engine's pool split: a fallback reserve beside lossy strategies, and the
16-bit and int8 pools of kvCacheDtype auto switching; the operator passes both to the engine."""

from __future__ import annotations

import pytest

from kvpilot.operator.builders.engine_args import strategy_flags
from kvpilot.operator.spec import ServiceSpec
from kvpilot.planner import KVStrategy, ModelShape, gpu_spec, plan_capacity
from kvpilot.planner.pools import exact_sequence_bytes
from tests.helpers.model_configs import LLAMA3_8B

pytestmark = pytest.mark.unit
MODEL = ModelShape.from_hf_config(LLAMA3_8B)
H200 = gpu_spec("NVIDIA-H200")


def plan(seq: int = 8192, **strategy):
    return plan_capacity(MODEL, KVStrategy(**strategy), H200, max_seq_len=seq)


def test_a_lossy_strategy_plans_its_concurrency_beside_the_fallback_reserve():
    plain = plan(kv_cache_dtype="int8", fallback_reserve=0.0)
    guarded = plan(kv_cache_dtype="int8", fallback_reserve=0.2)
    assert plain.reserve_bytes == 0 and guarded.kv_pool_bytes == plain.kv_pool_bytes
    assert guarded.reserve_bytes == int(plain.kv_pool_bytes * 0.2)
    assert guarded.max_concurrency == (guarded.kv_pool_bytes - guarded.reserve_bytes) // guarded.per_request_peak_bytes
    assert guarded.max_concurrency < plain.max_concurrency
    # the reserve holds 16-bit sequences: bf16 K/V of every layer
    assert guarded.reserve_sequences == guarded.reserve_bytes // exact_sequence_bytes(MODEL, KVStrategy(), 8192)
    assert f"{guarded.reserve_sequences} exact-path sequences" in guarded.reason


def test_a_calibrated_gqa_conversion_with_a_reserve_counts_the_original_o_proj():
    from kvpilot.planner.pools import extra_weight_bytes

    base = dict(attention="gqa", kv_head_groups=4, kv_cache_dtype="bf16")
    plain, calibrated = KVStrategy(**base), KVStrategy(**base, calibrated=True)
    o_proj = MODEL.num_layers * MODEL.hidden_size * MODEL.num_attention_heads * MODEL.head_dim * 2  # bf16
    assert extra_weight_bytes(MODEL, calibrated) - extra_weight_bytes(MODEL, plain) == o_proj
    unguarded = dict(base, fallback_reserve=0.0)  # no reserve: nothing needs the original o_proj
    assert extra_weight_bytes(MODEL, KVStrategy(**unguarded, calibrated=True)) == extra_weight_bytes(
        MODEL, KVStrategy(**unguarded))
    assert plan(**base, calibrated=True).max_concurrency <= plan(**base).max_concurrency


def test_an_exact_strategy_keeps_no_reserve():
    assert plan(kv_cache_dtype="bf16", fallback_reserve=0.3).reserve_bytes == 0


def test_a_reserve_too_small_for_one_sequence_says_so():
    tiny = plan(seq=131072, kv_cache_dtype="fp8", fallback_reserve=0.01)
    assert tiny.reserve_sequences == 0 and "none fits" in tiny.reason


def test_auto_switching_plans_both_pools():
    p16 = plan(kv_cache_dtype="auto", kv_quant_auto_threshold=8, kv_quant_auto_split=0.5)
    half = p16.kv_pool_bytes // 2
    per16 = exact_sequence_bytes(MODEL, KVStrategy(), 8192)
    per8 = plan(kv_cache_dtype="int8", fallback_reserve=0.0).per_request_peak_bytes
    assert p16.pool16_sequences == half // per16 and p16.pool8_sequences == (p16.kv_pool_bytes - half) // per8
    assert p16.max_concurrency == p16.pool16_sequences + p16.pool8_sequences
    assert p16.reserve_bytes == 0  # its 16-bit pool is the exact path


def test_a_threshold_above_the_16bit_pool_never_switches():
    stuck = plan(kv_cache_dtype="auto", kv_quant_auto_threshold=10_000)
    assert stuck.max_concurrency == stuck.pool16_sequences and "never used" in stuck.reason


def test_the_crd_fields_reach_the_planner_and_the_engine_flags():
    spec = ServiceSpec.from_dict({
        "model": {"uri": "pvc://m/llama"}, "resources": {"gpuProduct": "NVIDIA-H200"},
        "strategy": {"kvCacheDtype": "auto", "kvQuantAutoThreshold": 16, "kvQuantAutoSplit": 0.25,
                     "fallbackReserve": 0.05},
    })
    strategy = spec.strategy.planner_strategy()
    assert (strategy.kv_quant_auto_threshold, strategy.kv_quant_auto_split, strategy.fallback_reserve) == (16, 0.25, 0.05)
    flags = strategy_flags(spec.strategy)
    for flag, value in (("--kv-quant-auto-threshold", "16"), ("--kv-quant-auto-split", "0.25"),
                        ("--fallback-reserve", "0.05")):
        assert flags[flags.index(flag) + 1] == value
    int8 = ServiceSpec.from_dict({"model": {"uri": "pvc://m/llama"}, "resources": {"gpuProduct": "NVIDIA-H200"},
                                  "strategy": {"kvCacheDtype": "int8"}})
    assert "--kv-quant-auto-threshold" not in strategy_flags(int8.strategy)
    assert int8.strategy.planner_strategy().fallback_reserve == 0.1  # the CRD's and the engine's default
