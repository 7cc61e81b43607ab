"""Capacity planner: bytes per token per strategy, the memory account and its limits."""

from __future__ import annotations

import pytest

from kvpilot.planner import (
    GPU_PRODUCTS,
    InfeasiblePlanError,
    KVStrategy,
    ModelShape,
    PlannerError,
    format_plan,
    gpu_spec,
    kv_footprint,
    max_seq_len_from_p95,
    parameter_count,
    plan_capacity,
)
from tests.helpers.model_configs import DEEPSEEK_V3_FP8 as DEEPSEEK_V3
from tests.helpers.model_configs import LLAMA3_8B

pytestmark = pytest.mark.unit

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

LLAMA2_7B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000, "torch_dtype": "float16",
}
QWEN2_7B = {
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064, "torch_dtype": "bfloat16",
    "layer_types": ["full_attention"] * 28,
}
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 27, "n_routed_experts": 64,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "vocab_size": 102400, "torch_dtype": "bfloat16",
}
MINIMAX_SMALL = {  # MiniMax-Text-01 layout (7 lightning layers, then 1 softmax), scaled down
    "model_type": "minimax", "hidden_size": 1024, "intermediate_size": 2048, "num_attention_heads": 8,
    "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 8, "num_local_experts": 4,
    "num_experts_per_tok": 2, "vocab_size": 32000, "attn_type_list": [0, 0, 0, 0, 0, 0, 0, 1],
}


def shape(cfg: dict) -> ModelShape:
    return ModelShape.from_hf_config(cfg)


def test_seed_002_llama2_7b_mha_is_512_kib_per_token_at_fp16() -> None:
    fp = kv_footprint(shape(LLAMA2_7B), KVStrategy(kv_cache_dtype="fp16"))
    assert fp.bytes_per_token == 512 * KIB
    # seed 002: "4K context about 2 GB, 8K about 4 GB, 32K about 16 GB"
    assert fp.sequence_bytes(4096, 16) == 2 * GIB
    assert fp.sequence_bytes(32768, 16) == 16 * GIB


def test_llama3_8b_native_gqa_is_128_kib_per_token() -> None:
    assert kv_footprint(shape(LLAMA3_8B), KVStrategy()).bytes_per_token == 128 * KIB


def test_gqa_strategy_on_mha_model_scales_with_kv_heads() -> None:
    model = shape(LLAMA2_7B)
    assert kv_footprint(model, KVStrategy(attention="gqa", kv_head_groups=8)).bytes_per_token == 128 * KIB
    assert kv_footprint(model, KVStrategy(attention="gqa", kv_head_groups=32)).bytes_per_token == 512 * KIB


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_quantised_kv_halves_bytes_plus_int8s_fp32_scale_per_head_vector(dtype: str) -> None:
    model = shape(LLAMA3_8B)
    quantised = kv_footprint(model, KVStrategy(kv_cache_dtype=dtype)).bytes_per_token
    scales = 32 * 2 * 8 * 4 if dtype == "int8" else 0  # layers x (K, V) x kv heads x fp32; fp8's are per layer
    assert quantised == 64 * KIB + scales
    assert quantised < 128 * KIB


def test_auto_dtype_plans_with_the_model_precision() -> None:
    fp32 = shape({**LLAMA3_8B, "torch_dtype": "float32"})
    assert kv_footprint(fp32, KVStrategy(kv_cache_dtype="auto")).bytes_per_token == 256 * KIB
    assert kv_footprint(fp32, KVStrategy(kv_cache_dtype="bf16")).bytes_per_token == 128 * KIB


def test_deepseek_native_mla_caches_latent_plus_rope_key() -> None:
    lite = shape(DEEPSEEK_V2_LITE)
    assert lite.mla is not None and lite.moe is not None
    assert kv_footprint(lite, KVStrategy()).bytes_per_token == 27 * (512 + 64) * 2
    v3 = shape(DEEPSEEK_V3)
    assert kv_footprint(v3, KVStrategy(attention="mla")).bytes_per_token == 61 * 576 * 2
    assert kv_footprint(v3, KVStrategy(kv_cache_dtype="int8")).bytes_per_token == 61 * (576 + 4)
    assert kv_footprint(v3, KVStrategy(kv_cache_dtype="fp8")).bytes_per_token == 61 * 576


def test_deepseek_parameter_counts_match_published_sizes() -> None:
    assert 15.0e9 < parameter_count(shape(DEEPSEEK_V2_LITE)) < 16.5e9  # "16B"
    assert 660e9 < parameter_count(shape(DEEPSEEK_V3)) < 690e9  # 671B + MTP
    assert 6.6e9 < parameter_count(shape(LLAMA2_7B)) < 6.9e9
    assert 7.9e9 < parameter_count(shape(LLAMA3_8B)) < 8.1e9
    assert 7.4e9 < parameter_count(shape(QWEN2_7B)) < 7.8e9


def test_mla_strategy_on_llama_caches_one_latent_of_latent_rank() -> None:
    fp = kv_footprint(shape(LLAMA2_7B), KVStrategy(attention="mla", latent_rank=512))
    assert fp.bytes_per_token == 32 * 512 * 2
    assert fp.bytes_per_token * 16 == 512 * KIB  # one latent of d/8 replaces K and V (2 x d)


def test_linear_strategy_keeps_every_token_and_a_summary() -> None:
    """The engine's Performer conversion reads its window from, and falls back to, every token's K/V."""
    model = shape(LLAMA3_8B)
    fp = kv_footprint(model, KVStrategy(attention="linear", linear_window=64))
    assert fp.bytes_per_token == kv_footprint(model, KVStrategy()).bytes_per_token == 128 * KIB
    assert fp.fixed_bytes_per_sequence == 32 * 8 * 128 * (128 + 1) * 4  # layers x [Hkv, m, Dv + 1] fp32
    assert kv_footprint(model, KVStrategy(attention="linear", linear_window=512)) == fp  # compute, not memory
    wide = kv_footprint(model, KVStrategy(attention="linear", linear_feature_dim=256))
    assert wide.fixed_bytes_per_sequence == 2 * fp.fixed_bytes_per_sequence


def test_minimax_hybrid_keeps_kv_only_for_softmax_layers() -> None:
    model = shape(MINIMAX_SMALL)
    assert (model.num_full_layers, model.num_linear_layers) == (1, 7)
    fp = kv_footprint(model, KVStrategy())
    assert fp.bytes_per_token == 1 * 2 * 8 * 128 * 2
    assert fp.fixed_bytes_per_sequence == 7 * (8 * 128 * 128 + 8 * 128) * 4
    hf_style = shape({**MINIMAX_SMALL, "attn_type_list": None,
                      "layer_types": ["linear_attention"] * 7 + ["full_attention"]})
    assert kv_footprint(hf_style, KVStrategy()) == fp


def test_plan_h200_llama2_follows_the_memory_account() -> None:
    gpu = gpu_spec("NVIDIA-H200")
    assert gpu.memory_bytes == 143771 * MIB
    plan = plan_capacity(shape(LLAMA2_7B), KVStrategy(kv_cache_dtype="fp16"), gpu, max_seq_len=4096,
                         weights_bytes_override=13 * GIB, activation_peak_bytes_override=2 * GIB)
    free = 143771 * MIB - 13 * GIB - gpu.cuda_context_bytes - 2 * GIB
    assert plan.free_bytes == free
    assert plan.kv_pool_bytes == int(free * 0.8)
    assert plan.per_request_peak_bytes == 2 * GIB
    assert plan.max_concurrency == int(free * 0.8) // (2 * GIB)
    assert plan.block_bytes == 16 * 512 * KIB
    assert plan.num_blocks == plan.kv_pool_bytes // plan.block_bytes
    assert plan.num_blocks >= plan.max_concurrency * plan.blocks_per_request
    assert plan.feasible and plan.require() is plan


def test_blocks_round_up_the_per_request_peak() -> None:
    plan = plan_capacity(shape(LLAMA3_8B), KVStrategy(block_size=16), gpu_spec("h100"), max_seq_len=17)
    assert plan.blocks_per_request == 2
    assert plan.per_request_peak_bytes == 32 * 128 * KIB


def test_oversized_model_is_infeasible_with_the_numbers() -> None:
    plan = plan_capacity(shape(DEEPSEEK_V3), KVStrategy(), gpu_spec("NVIDIA-A10G"), max_seq_len=4096)
    assert not plan.feasible and plan.max_concurrency == 0 and plan.kv_pool_bytes == 0
    assert "weights" in plan.reason and "exceed" in plan.reason and "NVIDIA-A10G" in plan.reason
    with pytest.raises(InfeasiblePlanError) as err:
        plan.require()
    assert err.value.plan is plan


def test_too_long_max_seq_len_is_infeasible_and_names_the_longest_that_fits() -> None:
    plan = plan_capacity(shape(LLAMA2_7B), KVStrategy(), gpu_spec("NVIDIA-A10G"), max_seq_len=32768)
    assert plan.free_bytes > 0 and not plan.feasible
    assert "max_seq_len 32768" in plan.reason and "the longest max_seq_len that fits is" in plan.reason
    longest = int(plan.reason.split("fits is ")[1].split(";")[0])
    fits = plan_capacity(shape(LLAMA2_7B), KVStrategy(), gpu_spec("NVIDIA-A10G"), max_seq_len=longest)
    assert fits.feasible and fits.max_concurrency == 1
    assert not plan_capacity(shape(LLAMA2_7B), KVStrategy(), gpu_spec("NVIDIA-A10G"),
                             max_seq_len=longest + 16).feasible


def test_tensor_parallel_splits_heads_and_copies_the_mla_latent() -> None:
    llama = plan_capacity(shape(LLAMA3_8B), KVStrategy(), gpu_spec("h100"), max_seq_len=4096, gpus=2)
    assert llama.bytes_per_token == 128 * KIB and llama.total_memory_bytes == 2 * 81559 * MIB
    gqa1 = plan_capacity(shape(LLAMA3_8B), KVStrategy(attention="gqa", kv_head_groups=1), gpu_spec("h100"),
                         max_seq_len=4096, gpus=4)
    assert gqa1.bytes_per_token == 4 * 16 * KIB  # one KV head copied to four GPUs
    v3 = plan_capacity(shape(DEEPSEEK_V3), KVStrategy(), gpu_spec("h200"), max_seq_len=4096, gpus=8)
    assert v3.bytes_per_token == 8 * 61 * 576 * 2
    assert v3.feasible


def test_p95_plus_twenty_percent_rounded_to_a_block() -> None:
    assert max_seq_len_from_p95(1000) == 1200
    assert max_seq_len_from_p95(3000, block_size=16) == 3600
    assert max_seq_len_from_p95(1001, block_size=16) == 1216


@pytest.mark.parametrize(
    ("strategy", "model", "message"),
    [
        (dict(attention="gqa", kv_head_groups=3), LLAMA3_8B, "must divide the model's 8 KV heads"),
        (dict(attention="gqa"), LLAMA3_8B, "needs kv_head_groups"),
        (dict(attention="mla"), LLAMA3_8B, "needs latent_rank"),
        (dict(attention="gqa", kv_head_groups=2), DEEPSEEK_V2_LITE, "MLA latent"),
        (dict(attention="sparse"), LLAMA3_8B, "choose one of native, gqa, mla, linear"),
        (dict(kv_cache_dtype="int4"), LLAMA3_8B, "choose one of auto, bf16, fp16, int8, fp8"),
    ],
)
def test_wrong_strategy_says_what_is_allowed(strategy: dict, model: dict, message: str) -> None:
    with pytest.raises(PlannerError, match=message):
        kv_footprint(shape(model), KVStrategy(**strategy))


def test_wrong_inputs_name_the_field() -> None:
    with pytest.raises(PlannerError, match="'num_hidden_layers'"):
        ModelShape.from_hf_config({k: v for k, v in LLAMA3_8B.items() if k != "num_hidden_layers"})
    with pytest.raises(PlannerError, match="not in the planner's table"):
        gpu_spec("NVIDIA-B999")
    with pytest.raises(PlannerError, match="watermark"):
        plan_capacity(shape(LLAMA3_8B), KVStrategy(), gpu_spec("h200"), max_seq_len=10, watermark=1.5)
    with pytest.raises(PlannerError, match="max_seq_len must be >= 1"):
        plan_capacity(shape(LLAMA3_8B), KVStrategy(), gpu_spec("h200"), max_seq_len=0)


def test_gpu_table_and_aliases() -> None:
    assert gpu_spec("h200") is gpu_spec("nvidia-h200") is GPU_PRODUCTS["NVIDIA-H200"]
    assert gpu_spec("A100-40GB").memory_bytes == 40960 * MIB
    assert gpu_spec("L40S").memory_bytes == 46068 * MIB
    assert gpu_spec("NVIDIA-A10G").memory_bytes == 23028 * MIB


def test_table_lists_the_account_and_limits() -> None:
    plan = plan_capacity(shape(LLAMA2_7B), KVStrategy(kv_cache_dtype="fp16"), gpu_spec("h200"), max_seq_len=4096)
    text = format_plan(plan)
    for needle in ("weights", "CUDA context", "activation peak", "KV pool (80% watermark)",
                   "512 KiB", "max concurrency", f"  {plan.max_concurrency}\n", "feasible"):
        assert needle in text


def test_eviction_plans_the_blocks_a_sequence_keeps_resident() -> None:
    """Sinks + window (+ a ladder) stay resident, plus the block being filled; room for one prefill chunk."""
    model, gpu = shape(LLAMA3_8B), gpu_spec("NVIDIA-H200")
    full = plan_capacity(model, KVStrategy(), gpu, max_seq_len=32768)
    sinks = plan_capacity(model, KVStrategy(eviction="sinks", eviction_sinks=4, eviction_window=1024), gpu,
                          max_seq_len=32768)
    assert sinks.blocks_per_request == 1 + 64 + 1  # ceil(4/16) sink blocks, 64 window blocks, the partial one
    assert sinks.per_request_peak_bytes == 66 * 16 * 128 * KIB
    chunk = 8192 * 128 * KIB  # the default prefill budget lands before its eviction
    serving = sinks.kv_pool_bytes - sinks.reserve_bytes  # eviction is lossy: a fallback reserve holds full ones
    assert sinks.reserve_bytes and sinks.reserve_sequences == sinks.reserve_bytes // full.per_request_peak_bytes
    assert sinks.max_concurrency == (serving - chunk) // sinks.per_request_peak_bytes > 20 * full.max_concurrency
    ladder = plan_capacity(model, KVStrategy(eviction="ladder", eviction_window=1024), gpu, max_seq_len=32768)
    assert ladder.blocks_per_request == 1 + 64 + 64 + 11 + 1 + 1  # + the span and a rounding per level (log2 2048)
    short = plan_capacity(model, KVStrategy(eviction="sinks"), gpu, max_seq_len=512)
    assert short.blocks_per_request == 32  # never more than the whole sequence
    with pytest.raises(PlannerError, match="eviction_window >= 1"):
        KVStrategy(eviction="sinks", eviction_window=0)
    with pytest.raises(PlannerError, match="choose one of none, sinks, ladder"):
        KVStrategy(eviction="oldest")


def test_the_engine_keeps_no_more_than_the_planner_counts() -> None:
    from kvpilot.engine.strategies.eviction.policy import EvictionPolicy

    for mode, sinks, window, span in [("sinks", 4, 1024, None), ("ladder", 0, 256, 128), ("ladder", 16, 64, None)]:
        policy = EvictionPolicy.from_tokens(mode, sinks, window, span, 16)
        strategy = KVStrategy(eviction=mode, eviction_sinks=sinks, eviction_window=window, eviction_ladder_span=span)
        for tokens in (16, 1000, 5000, 40000, 40001):
            held = len(policy.kept(tokens // 16)) + (1 if tokens % 16 else 0)  # full blocks kept + the partial one
            assert held <= strategy.resident_blocks(tokens), (mode, tokens)
            assert strategy.resident_blocks(tokens) <= held + 1 + int(mode == "ladder") * 12, (mode, tokens)


def test_the_operators_plan_counts_the_logits_of_every_sequence_it_admits() -> None:
    """The operator runs the engine with --max-num-seqs = the plan's concurrency, so the plan it uses counts that
    many sequences' logits (fp32 over the vocabulary, up to the prefill budget), not the default 256."""
    from kvpilot.planner import plan_admitting

    model, gpu = shape(LLAMA3_8B), gpu_spec("NVIDIA-H200")
    strategy = KVStrategy(eviction="sinks", eviction_window=256)
    first = plan_capacity(model, strategy, gpu, max_seq_len=32768)
    assert first.max_num_seqs == 256 and first.max_concurrency > 2000  # the logits of 256, the pool of thousands
    plan = plan_admitting(model, strategy, gpu, max_seq_len=32768)
    assert plan.max_num_seqs == first.max_concurrency >= plan.max_concurrency
    extra_logits = (min(plan.max_num_seqs, 8192) - 256) * 128256 * 4  # min(seqs, prefill budget) fp32 rows
    assert plan.activation_peak_bytes - first.activation_peak_bytes == extra_logits
    native = plan_admitting(model, KVStrategy(), gpu, max_seq_len=8192)
    assert native == plan_capacity(model, KVStrategy(), gpu, max_seq_len=8192)  # admits < 256: one plan
