"""Native MiniMax hybrid attention equals HF `MiniMaxForCausalLM` token for token (CPU, fp32).

A 4-layer checkpoint (lightning, softmax, lightning, lightning; 4 experts, top-2; alpha/beta factors
that are not 1) with a mixed-length batch: whole prefills, chunked prefills, and a KV pool small
enough to force preemption, where the lightning state is freed and rebuilt (summary misses).
"""

from __future__ import annotations

import random

import pytest

from kvpilot.engine.llm import LLM
from kvpilot.engine.sampling_params import SamplingParams
from tests.helpers.minimax import build_minimax_checkpoint
from tests.helpers.models import hf_greedy
from tests.parity.helpers import assert_varied, greedy_ids

pytestmark = pytest.mark.parity

MAX_NEW = 10
CONFIGS = {
    "whole-prefill": {},
    "chunked": {"max_num_batched_tokens": 7, "block_size": 8},
    "tiny-pool-preempt": {"num_kv_blocks": 10, "block_size": 8},
}


def _prompts() -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(3, 384) for _ in range(n)] for n in (1, 5, 17, 40)]  # 40 > HF's 16-token block


PROMPTS = _prompts()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[str, list[list[int]]]:
    path = build_minimax_checkpoint(tmp_path_factory.mktemp("minimax"))
    return str(path), hf_greedy(path, PROMPTS, MAX_NEW)


def generate(llm: LLM, prompts: list[list[int]] = PROMPTS, max_new: int = MAX_NEW) -> list[list[int]]:
    return greedy_ids(llm, prompts, max_new, ignore_eos=True)


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_minimax_greedy_matches_hf(checkpoint, config_name: str) -> None:
    path, expected = checkpoint
    assert_varied(expected)
    llm = LLM(path, show_progress=False, **CONFIGS[config_name])
    engine = llm.engine
    assert engine.runner.linear_state is not None and len(engine.runner.linear_state.layers) == 3
    assert engine.runner.kv_cache.shape[1] == 1, "only the softmax layer has a paged KV cache"
    assert not engine.block_manager.enable_prefix_caching, (
        "a recurrent state cannot start from a cached prefix"
    )
    assert generate(llm) == expected
    linear = engine.stats()["linear"]
    preemptions = engine.scheduler.num_preemptions
    if config_name.startswith("tiny-pool"):
        assert preemptions > 0, "the tiny pool was meant to force preemption"
    # one miss per cold start and one per rebuild after a preemption; every other step hits
    assert linear["summary_misses_total"] == len(PROMPTS) + preemptions
    assert linear["summary_hits_total"] > 0
    pool = engine.runner.linear_state.pool
    pool.check()
    assert pool.num_used == 0, "finished sequences must give their state slots back"


def test_minimax_pools_count_only_softmax_kv_and_the_state_bytes(checkpoint) -> None:
    path, _ = checkpoint
    budget = 2**20
    llm = LLM(path, show_progress=False, cpu_kv_cache_bytes=budget, max_num_seqs=8, block_size=16)
    runner = llm.engine.runner
    state = runner.linear_state
    assert state.bytes_total == 8 * 3 * 4 * 16 * 16 * 4  # slots x lightning layers x H x D x D x fp32
    assert runner.bytes_per_block == 2 * 1 * 16 * 2 * 16 * 4  # K and V x 1 softmax layer x 16 tokens
    assert runner.num_kv_blocks == (budget - state.bytes_total) // runner.bytes_per_block


def test_minimax_abort_frees_the_state_slot(checkpoint) -> None:
    path, _ = checkpoint
    llm = LLM(path, show_progress=False)
    engine = llm.engine
    engine.add_request("a", PROMPTS[3], SamplingParams(temperature=0.0, max_tokens=50))
    engine.step()
    assert engine.runner.linear_state.pool.num_used == 1
    engine.abort_request("a")
    assert engine.runner.linear_state.pool.num_used == 0


def test_minimax_engine_restart_is_a_cold_start(checkpoint) -> None:
    """A new engine (a restart) holds no state: the same request is a miss again, and equal."""
    path, expected = checkpoint
    for _ in range(2):
        llm = LLM(path, show_progress=False)
        assert generate(llm, PROMPTS[2:3]) == expected[2:3]
        assert llm.engine.stats()["linear"]["summary_misses_total"] == 1


def test_minimax_score_matches_hf_logprobs(checkpoint) -> None:
    import torch
    import transformers

    path, _ = checkpoint
    prompt, continuation = PROMPTS[3][:30], PROMPTS[3][30:]
    got = LLM(path, show_progress=False).engine.score(prompt, continuation)
    model = transformers.MiniMaxForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + continuation])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    want = logprobs.gather(-1, torch.tensor(continuation)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(got), want, atol=1e-4)


def test_minimax_triton_interpreter_matches_hf(checkpoint, monkeypatch) -> None:
    """The lightning prefill and decode kernels (and the paged ones) under TRITON_INTERPRET."""
    path, expected = checkpoint
    monkeypatch.setenv("KVPILOT_KERNELS", "triton")
    llm = LLM(path, show_progress=False, max_num_batched_tokens=16, block_size=16)
    assert generate(llm, PROMPTS[1:3], 3) == [e[:3] for e in expected[1:3]]
