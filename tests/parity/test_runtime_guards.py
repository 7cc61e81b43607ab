"""Every lossy strategy guarded at run time: a broken variant falls back to its exact path and then
matches the exact engine token for token; a healthy one passes its checks at threshold 0.92.

Tiny random Llama, CPU, torch paths. A fallback happens at the step that produces completion token
`EVERY` (index EVERY); the sequence is recomputed on the exact path from there, so its tokens from
index EVERY + 1 on are the exact engine's greedy continuation of prompt + the tokens before.
"""

from __future__ import annotations

import pytest

from kvpilot.engine.llm_engine import LLMEngine
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import engine_greedy, make_engine

pytestmark = pytest.mark.parity

EVERY = 4
NEW = 14
# half the pool as the reserve: one of these sequences fits it (the default 10% of 64 blocks would not)
GUARDED = {"validate_every": EVERY, "validation_sample_rate": 1.0, "validation_threshold": 0.92,
           "fallback_reserve": 0.5}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_hf_checkpoint(tmp_path_factory.mktemp("guards") / "llama", "llama")


def engine(ckpt, **kw) -> LLMEngine:
    return make_engine(ckpt, **{"device": "cpu", "block_size": 8, "num_kv_blocks": 64, **kw})


def prompt_of(n: int, seed: int = 0) -> list[int]:
    return [(i * 37 + 11 + seed * 101) % 370 + 3 for i in range(n)]


def run(eng: LLMEngine, prompt: list[int]) -> tuple[list[int], dict]:
    got = engine_greedy(eng, [prompt], NEW, ["r"])[0]
    return got, eng.stats()["validation"]


def fallbacks(feed: dict, strategy: str) -> int:
    return sum(feed["fallbacks_total"][strategy].values())


def assert_fell_back_then_exact(ckpt, got: list[int], feed: dict, strategy: str, prompt: list[int]) -> None:
    print(strategy, feed)
    assert feed["checks_total"] == 1, feed  # after its first (failed) check the sequence runs exactly
    assert fallbacks(feed, strategy) == 1 and feed["unrecovered_total"] == {}
    assert feed["last_cosine"] is None or feed["last_cosine"] < 0.92
    k = EVERY + 1
    assert got[k:] == engine_greedy(engine(ckpt), [prompt + got[:k]], NEW - k)[0]


def assert_healthy(feed: dict, strategy: str) -> None:
    print(strategy, feed)
    assert feed["checks_total"] >= NEW // EVERY - 1 and fallbacks(feed, strategy) == 0, feed
    assert feed["unrecovered_total"] == {} and feed["last_cosine"] >= 0.92


def corrupt_k_scales(eng: LLMEngine) -> None:
    """Test hook: after every 8-bit store, every K scale of the layer is made negative (|s| -> -|s|),
    so the 8-bit pool dequantises each key as its negation; the 16-bit reserve is untouched."""
    for attn in eng.runner.model.attention_layers():
        quant = attn.kv_quant
        store = quant._store

        def corrupted(k, v, slots, graph_static, quant=quant, store=store):
            store(k, v, slots, graph_static)
            quant.k_scale.abs_().neg_()

        quant._store = corrupted


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_8bit_cache_with_a_corrupted_scale_falls_back_to_the_16bit_reserve(ckpt, kv):
    eng = engine(ckpt, kv_cache_dtype=kv, **GUARDED)
    corrupt_k_scales(eng)
    prompt = prompt_of(40)
    got, feed = run(eng, prompt)
    assert_fell_back_then_exact(ckpt, got, feed, f"kv_{kv}", prompt)
    assert feed["reserve"]["blocks_total"] == eng.runner.kv_pool_sizes[0] > 0
    assert eng.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_healthy_8bit_cache_passes_its_checks(ckpt, kv):
    _, feed = run(engine(ckpt, kv_cache_dtype=kv, **GUARDED), prompt_of(40))
    assert_healthy(feed, f"kv_{kv}")


def test_eviction_of_most_of_the_context_falls_back_to_the_reserve(ckpt):
    eng = engine(ckpt, eviction="sinks", eviction_sinks=0, eviction_window=8, **GUARDED)
    prompt = prompt_of(120)
    got, feed = run(eng, prompt)
    assert_fell_back_then_exact(ckpt, got, feed, "eviction", prompt)
    assert feed["reserve"]["blocks_total"] == 32


def test_healthy_eviction_passes_its_checks(ckpt):
    eng = engine(ckpt, eviction="sinks", eviction_sinks=8, eviction_window=96, **GUARDED)
    _, feed = run(eng, prompt_of(120))
    assert_healthy(feed, "eviction")


def test_rank_one_performer_falls_back_to_exact_attention(ckpt):
    eng = engine(ckpt, attention="linear", linear_window=2, linear_features=1, **GUARDED)
    prompt = prompt_of(60)
    got, feed = run(eng, prompt)
    assert_fell_back_then_exact(ckpt, got, feed, "linear", prompt)


def test_healthy_performer_passes_its_checks(ckpt):
    _, feed = run(engine(ckpt, attention="linear", linear_window=48, **GUARDED), prompt_of(60))
    assert_healthy(feed, "linear")


def test_a_full_reserve_makes_the_second_fallback_wait_then_recompute_exactly(ckpt):
    """Two sequences fail on the same step; the 16-bit reserve (10 blocks of 8) holds one 54-token
    sequence (7 blocks): the other waits, preempted, and is recomputed exactly once blocks free."""
    eng = engine(ckpt, kv_cache_dtype="int8", **GUARDED)
    corrupt_k_scales(eng)
    prompts = [prompt_of(40), prompt_of(40, seed=1)]
    got = engine_greedy(eng, prompts, NEW, ["a", "b"])
    feed = eng.stats()["validation"]
    assert feed["reserve"]["blocks_total"] == 10 and feed["reserve"]["full_total"] == 1
    assert feed["fallbacks_total"]["kv_int8"]["low_cosine"] == 2 and feed["checks_total"] == 2
    k = EVERY + 1
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens[k:] == engine_greedy(engine(ckpt), [prompt + tokens[:k]], NEW - k)[0]
    assert eng.block_manager.num_used_blocks == 0


def full_rank(eng: LLMEngine) -> int:
    mc = eng.model_config
    return min(2 * mc.num_key_value_heads * mc.head_dim, mc.hidden_size)


def test_rank_one_mla_conversion_falls_back_to_the_unconverted_layers(ckpt):
    # a rank-1 latent block is 1/64 of a K/V block: 4096 of them, half their bytes as K/V reserve (32 blocks)
    eng = engine(ckpt, attention="mla", latent_rank=1, num_kv_blocks=4096, **GUARDED)
    prompt = prompt_of(40)
    got, feed = run(eng, prompt)
    assert_fell_back_then_exact(ckpt, got, feed, "mla", prompt)
    n_exact, n_latent = eng.runner.kv_pool_sizes
    assert feed["reserve"]["blocks_total"] == n_exact == 32 and n_latent == 2048
    kv = eng.stats()
    assert kv["memory_bytes"]["kv_pool"] == eng.runner.kv_cache.numel() * 4 + eng.runner.cache.reserve_cache.numel() * 4
    assert eng.block_manager.num_used_blocks == 0


def test_healthy_mla_conversion_passes_its_checks(ckpt):
    eng = engine(ckpt, attention="mla", latent_rank=64, **GUARDED)
    assert eng.runner.mla.latent_rank == full_rank(eng)
    _, feed = run(eng, prompt_of(40))
    assert_healthy(feed, "mla")


def test_reserve_and_latent_sequences_share_steps(ckpt):
    """Request 'b' is validated (rate 0.5 by request id) and falls back to the K/V reserve; 'a' is
    not and stays on the latent pool: every step after the fallback splits the batch by pool, and
    each sequence's tokens are those of its own path alone."""
    mla = {"attention": "mla", "latent_rank": 1, "num_kv_blocks": 4096}
    eng = engine(ckpt, **mla, **{**GUARDED, "validation_sample_rate": 0.5})
    prompts = [prompt_of(40), prompt_of(33, seed=2)]
    got = engine_greedy(eng, prompts, NEW, ["a", "b"])
    feed = eng.stats()["validation"]
    assert feed["fallbacks_total"]["mla"]["low_cosine"] == 1 and feed["checks_total"] == 1
    k = EVERY + 1
    assert got[1][k:] == engine_greedy(engine(ckpt), [prompts[1] + got[1][:k]], NEW - k)[0]
    assert got[0] == engine_greedy(engine(ckpt, **mla), [prompts[0]], NEW)[0]


@pytest.fixture(scope="module")
def paired_heads(tmp_path_factory):
    """A 4-KV-head checkpoint whose heads 0 = 1 and 2 = 3 (K and V): merging to 2 groups is exact."""
    import torch
    from safetensors.torch import load_file, save_file

    path = build_hf_checkpoint(tmp_path_factory.mktemp("guards-gqa") / "llama", "llama", num_key_value_heads=4)
    weights = load_file(path / "model.safetensors")
    for name, t in weights.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            heads = t.reshape(4, -1, t.shape[1]).clone()
            heads[1], heads[3] = heads[0], heads[2]
            weights[name] = heads.reshape(t.shape).contiguous()
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    assert torch.equal(weights["model.layers.0.self_attn.k_proj.weight"][:16],
                       weights["model.layers.0.self_attn.k_proj.weight"][16:32])
    return path


def test_gqa_merging_unlike_heads_falls_back_to_the_unmerged_reserve(paired_heads):
    """One group for four unlike heads: the validated layer's attention with the checkpoint's own K/V
    differs; the sequence moves to the reserve of full-head K/V and is served unmerged from then on."""
    eng = engine(paired_heads, attention="gqa", kv_head_groups=1, **GUARDED)
    prompt = prompt_of(40)
    got, feed = run(eng, prompt)
    assert_fell_back_then_exact(paired_heads, got, feed, "gqa", prompt)
    n_exact, n_merged = eng.runner.kv_pool_sizes
    assert feed["reserve"]["blocks_total"] == n_exact > 0 and n_merged > 0
    assert eng.runner.cache.reserve_cache.shape[4] == 4 and eng.runner.kv_cache.shape[4] == 1  # KV heads
    assert eng.block_manager.num_used_blocks == 0


def test_gqa_without_a_reserve_counts_failures_as_unrecovered(paired_heads):
    eng = engine(paired_heads, attention="gqa", kv_head_groups=1, **{**GUARDED, "fallback_reserve": 0.0})
    _, feed = run(eng, prompt_of(40))
    assert feed["checks_total"] == NEW // EVERY - (NEW % EVERY == 0) and feed["last_cosine"] < 0.92
    assert feed["unrecovered_total"] == {"gqa": feed["checks_total"]} and fallbacks(feed, "gqa") == 0


def test_gqa_merging_identical_heads_passes_its_checks(paired_heads):
    eng = engine(paired_heads, attention="gqa", kv_head_groups=2, **GUARDED)
    got, feed = run(eng, prompt_of(40))
    assert_healthy(feed, "gqa")
    assert feed["last_cosine"] > 0.99999
    assert got == engine_greedy(engine(paired_heads), [prompt_of(40)], NEW)[0]  # merging changed nothing


def test_unmerged_and_merged_gqa_sequences_share_steps(paired_heads):
    """As for MLA: 'b' falls back to the unmerged reserve, 'a' stays merged, in the same steps."""
    gqa = {"attention": "gqa", "kv_head_groups": 1}
    eng = engine(paired_heads, **gqa, **{**GUARDED, "validation_sample_rate": 0.5})
    prompts = [prompt_of(40), prompt_of(33, seed=2)]
    got = engine_greedy(eng, prompts, NEW, ["a", "b"])
    feed = eng.stats()["validation"]
    assert feed["fallbacks_total"]["gqa"]["low_cosine"] == 1 and feed["checks_total"] == 1
    k = EVERY + 1
    assert got[1][k:] == engine_greedy(engine(paired_heads), [prompts[1] + got[1][:k]], NEW - k)[0]
    assert got[0] == engine_greedy(engine(paired_heads, **gqa), [prompts[0]], NEW)[0]
