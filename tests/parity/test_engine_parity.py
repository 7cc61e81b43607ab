"""kvpilot greedy generations equal HF transformers token for token (CPU, fp32).

Every family (llama, qwen2, mistral) with MHA and GQA, under prefix caching on and off,
chunked prefill on and off, and a KV pool small enough to force preemption.
"""

from __future__ import annotations

import importlib.util

import pytest

from kvpilot.engine.llm import LLM
from tests.helpers.models import build_hf_checkpoint, hf_greedy
from tests.parity.helpers import assert_replay_and_release, greedy_ids, hf_reference_fixture, mixed_prompts

pytestmark = pytest.mark.parity

MAX_NEW = 10
VARIANTS = {  # name -> (family, num_key_value_heads); tiny models have 4 query heads
    "llama-mha": ("llama", 4),
    "llama-gqa4": ("llama", 1),
    "qwen2-mha": ("qwen2", 4),
    "qwen2-gqa": ("qwen2", 2),
    "mistral-gqa": ("mistral", 2),
}
CONFIGS = {
    "prefix+chunked": {},
    "no-prefix-no-chunk": {"enable_prefix_caching": False, "enable_chunked_prefill": False},
    "small-budget-chunks": {"max_num_batched_tokens": 7, "block_size": 8},
    "tiny-pool-preempt": {"num_kv_blocks": 10, "block_size": 8},
    # Chunking off, but a preempted sequence (prompt + output > 40) is recomputed in chunks.
    "tiny-pool-no-chunk": {
        "num_kv_blocks": 12,
        "block_size": 8,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 40,
    },
}


PROMPTS = mixed_prompts()


def build(out_dir, name: str):
    family, kv_heads = VARIANTS[name]
    return build_hf_checkpoint(out_dir, family, seed=len(name), num_key_value_heads=kv_heads)


checkpoint = hf_reference_fixture(build, PROMPTS, MAX_NEW)


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("checkpoint", list(VARIANTS), indirect=True)
def test_greedy_matches_hf(checkpoint, config_name: str) -> None:
    path, expected = checkpoint
    llm = LLM(path, show_progress=False, **CONFIGS[config_name])
    assert greedy_ids(llm, PROMPTS, MAX_NEW) == expected
    if config_name.startswith("tiny-pool"):
        assert llm.engine.scheduler.num_preemptions > 0, "the tiny pool was meant to force preemption"
    assert_replay_and_release(llm, PROMPTS, expected, MAX_NEW)


def _triton_kernels_present() -> bool:
    names = [
        f"kvpilot.engine.kernels.{op}.launcher" for op in ("store_kvcache", "paged_prefill", "paged_decode")
    ]
    return all(importlib.util.find_spec(n) is not None for n in names)


@pytest.mark.skipif(
    not _triton_kernels_present(), reason="Triton launchers for all three ops are not in the tree yet"
)
@pytest.mark.parametrize("checkpoint", ["llama-gqa4"], indirect=True)
def test_triton_interpreter_matches_hf(checkpoint, monkeypatch) -> None:
    path, expected = checkpoint
    monkeypatch.setenv("KVPILOT_KERNELS", "triton")
    llm = LLM(path, show_progress=False, max_num_batched_tokens=16, block_size=16)
    assert greedy_ids(llm, PROMPTS[:3], 3) == [e[:3] for e in expected[:3]]


def test_llama3_rope_scaling_matches_hf(tmp_path) -> None:
    # original_max_position_embeddings=32 puts the longer prompts past the scaling knee.
    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
        "rope_theta": 500000.0,
    }
    path = build_hf_checkpoint(
        tmp_path / "llama3", "llama", seed=5, rope_parameters=rope, rope_theta=500000.0
    )
    expected = hf_greedy(path, PROMPTS, MAX_NEW)
    llm = LLM(str(path), show_progress=False)
    assert llm.engine.model_config.rope_scaling["rope_type"] == "llama3"
    assert greedy_ids(llm, PROMPTS, MAX_NEW) == expected
