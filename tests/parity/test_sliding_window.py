"""Mistral's sliding window: kvpilot serves past it with HF transformers' outputs (CPU, fp32).

A tiny Mistral with `sliding_window` 8 (every prompt but one and every continuation runs past it):
greedy tokens equal HF's under prefix caching, small chunks, preemption and each strategy's one-flag
rollback (the checkpoint's own attention), on the torch path and
on the Triton kernels (interpreter); the dense path's logits equal HF's. Where the window is not
applied (an int8 KV cache), max_model_len stays within it, and asking for more is refused by name.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.llm import LLM
from tests.helpers.models import build_hf_checkpoint, hf_greedy
from tests.parity.helpers import (
    assert_replay_and_release,
    dense_logits,
    greedy_ids,
    hf_reference_fixture,
    mixed_prompts,
)

pytestmark = pytest.mark.parity

WINDOW = 8
MAX_NEW = 12
PROMPTS = mixed_prompts()
CONFIGS = {
    "prefix+chunked": {},
    "small-budget-chunks": {"max_num_batched_tokens": 7, "block_size": 8},
    "tiny-pool-preempt": {"num_kv_blocks": 10, "block_size": 8},
    "gqa-rolled-back": {"attention": "gqa", "kv_head_groups": 1, "disable_gqa": True},  # the checkpoint's own
    "mla-rolled-back": {"attention": "mla", "latent_rank": 16, "disable_mla": True},
    "linear-rolled-back": {"attention": "linear", "disable_linear": True},
}


def build(out_dir, name: str):
    return build_hf_checkpoint(out_dir, "mistral", seed=11, num_key_value_heads=2, sliding_window=WINDOW)


checkpoint = hf_reference_fixture(build, PROMPTS, MAX_NEW)


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("checkpoint", ["mistral-window8"], indirect=True)
def test_greedy_past_the_window_matches_hf(checkpoint, config_name: str, tmp_path) -> None:
    path, expected = checkpoint
    llm = LLM(path, show_progress=False, **CONFIGS[config_name])
    assert llm.engine.max_model_len > WINDOW  # the window is applied, not used as a length cap
    assert greedy_ids(llm, PROMPTS, MAX_NEW) == expected
    if config_name == "tiny-pool-preempt":
        assert llm.engine.scheduler.num_preemptions > 0, "the tiny pool was meant to force preemption"
    assert_replay_and_release(llm, PROMPTS, expected, MAX_NEW)
    if config_name == "prefix+chunked":  # the window matters here: HF without it continues otherwise
        full = build_hf_checkpoint(tmp_path / "full", "mistral", seed=11, num_key_value_heads=2, sliding_window=None)
        assert hf_greedy(full, PROMPTS, MAX_NEW) != expected


@pytest.mark.parametrize("checkpoint", ["mistral-window8"], indirect=True)
def test_sinks_eviction_of_the_oldest_blocks_frees_what_left_the_window(checkpoint) -> None:
    """Mistral's rolling buffer: --eviction sinks with 0 sinks and a window of W tokens keeps each sequence
    at a few blocks and gives HF's tokens."""
    path, expected = checkpoint
    llm = LLM(path, show_progress=False, block_size=8, eviction="sinks", eviction_sinks=0, eviction_window=WINDOW)
    assert greedy_ids(llm, PROMPTS, MAX_NEW) == expected
    engine = llm.engine
    assert engine.evictor.evicted_blocks_total > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks  # nothing held, nothing leaked
    with pytest.raises(ValueError, match="leaves gaps in the view"):  # a sink token would be a gap
        LLM(path, show_progress=False, block_size=8, eviction="sinks", eviction_sinks=4, eviction_window=WINDOW,
            max_model_len=64)


@pytest.mark.parametrize("checkpoint", ["mistral-window8"], indirect=True)
def test_triton_kernels_apply_the_window(checkpoint, monkeypatch) -> None:
    path, expected = checkpoint
    monkeypatch.setenv("KVPILOT_KERNELS", "triton")
    llm = LLM(path, show_progress=False, max_num_batched_tokens=16, block_size=16)
    assert greedy_ids(llm, PROMPTS[2:4], 4) == [e[:4] for e in expected[2:4]]  # 17 and 40 tokens: past the window


@pytest.mark.parametrize("checkpoint", ["mistral-window8"], indirect=True)
def test_dense_logits_match_hf(checkpoint) -> None:
    import transformers

    path, _ = checkpoint
    tokens = PROMPTS[3]  # 40 tokens
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0]
    got = dense_logits(LLM(path, show_progress=False), tokens)
    assert torch.allclose(got, want, atol=2e-4, rtol=1e-4), (got - want).abs().max()


@pytest.mark.parametrize("checkpoint", ["mistral-window8"], indirect=True)
def test_where_the_window_is_not_applied_the_length_stays_within_it(checkpoint) -> None:
    path, _ = checkpoint
    llm = LLM(path, show_progress=False, kv_cache_dtype="int8")
    assert llm.engine.max_model_len == WINDOW
    with pytest.raises(ValueError, match=r"sliding window \(8 tokens\).*int8 KV cache"):
        LLM(path, show_progress=False, kv_cache_dtype="int8", max_model_len=64)
