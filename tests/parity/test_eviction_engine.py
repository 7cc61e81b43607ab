"""Eviction in the engine against HF transformers run with the same visibility as a 4D attention mask.

The engine drops whole blocks and keeps every token's original position; the reference keeps every
token and hides the evicted ones from each query with a boolean mask. Greedy tokens must agree.
"""

from __future__ import annotations

import pytest

from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.strategies.eviction.policy import EvictionPolicy
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import engine_greedy, make_engine

pytestmark = pytest.mark.parity

BS = 16


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_hf_checkpoint(tmp_path_factory.mktemp("evict") / "llama", "llama")


def engine(ckpt, **kw) -> LLMEngine:
    return make_engine(ckpt, **{"device": "cpu", "block_size": BS, "num_kv_blocks": 24, **kw})


def generate(eng: LLMEngine, prompt: list[int], n: int) -> list[int]:
    return engine_greedy(eng, [prompt], n, ["r"])[0]


def visible_mask(policy: EvictionPolicy, prompt_len: int, total: int, chunk: int):
    """mask[p, q]: whether the engine's query at position p attends to position q."""
    import torch

    mask = torch.zeros(total, total, dtype=torch.bool)
    for p in range(total):
        # K/V blocks were last evicted at the start of p's prefill chunk, or before p's decode step
        start = (p // chunk) * chunk if p < prompt_len else p
        full = start // BS
        kept = set(policy.kept(full)) if policy.enabled else set(range(full))
        for q in range(p + 1):
            mask[p, q] = q >= full * BS or (q // BS) in kept
    return mask


def hf_masked_greedy(ckpt, prompt: list[int], n: int, policy: EvictionPolicy, chunk: int) -> list[int]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            mask = visible_mask(policy, len(prompt), len(tokens), chunk)
            logits = model(torch.tensor([tokens]), attention_mask=mask[None, None]).logits
            tokens.append(int(logits[0, -1].argmax()))
    return tokens[len(prompt) :]


def prompt_of(n: int, seed: int = 0) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(3, 380) for _ in range(n)]


@pytest.mark.parametrize("mode", ["sinks", "ladder"])
def test_eviction_matches_masked_reference(ckpt, mode):
    prompt, n = prompt_of(150), 40
    eng = engine(ckpt, eviction=mode, eviction_sinks=4, eviction_window=32, eviction_ladder_span=32)
    got = generate(eng, prompt, n)
    policy = eng.evictor.policy
    assert eng.evictor.evicted_blocks_total > 0
    assert got == hf_masked_greedy(ckpt, prompt, n, policy, chunk=policy.window_blocks * BS)
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks  # no leak once finished


def test_none_and_covering_window_equal_default(ckpt):
    prompt, n = prompt_of(70, seed=1), 30
    default = generate(engine(ckpt), prompt, n)
    assert generate(engine(ckpt, eviction="none"), prompt, n) == default
    wide = engine(ckpt, eviction="sinks", eviction_sinks=4, eviction_window=BS * 8, num_kv_blocks=40)
    assert generate(wide, prompt, n) == default
    assert wide.evictor.evicted_blocks_total == 0


def test_prompt_beyond_pool_is_admitted_only_with_eviction(ckpt):
    prompt = prompt_of(300, seed=2)  # the pool holds 12 x 16 = 192 tokens
    plain = engine(ckpt, num_kv_blocks=12)
    with pytest.raises(ValueError, match="at most 191"):
        plain.add_request("long", prompt, SamplingParams(max_tokens=4))
    eng = engine(ckpt, num_kv_blocks=12, eviction="sinks", eviction_sinks=4, eviction_window=32)
    from kvpilot.engine.server.runtime.server_runtime import (
        engine_max_model_len,  # fastapi: not on the GPU box
    )

    assert engine_max_model_len(eng) == eng.max_model_len > len(prompt)  # what the server admits by
    assert len(generate(eng, prompt, 8)) == 8
    assert eng.block_manager.num_free_blocks == 12


def test_pool_too_small_for_the_window_is_refused(ckpt):
    with pytest.raises(ValueError, match="eviction_window"):
        engine(ckpt, num_kv_blocks=4, eviction="sinks", eviction_window=64)


def test_scoring_sees_the_evicted_view(ckpt):
    import torch

    text = prompt_of(120, seed=3)
    exact = engine(ckpt).score(text[:1], text[1:])
    wide = engine(ckpt, eviction="sinks", eviction_window=BS * 10, num_kv_blocks=40).score(text[:1], text[1:])
    assert torch.allclose(torch.tensor(wide), torch.tensor(exact), atol=1e-4)  # nothing evicted: exact
    narrow = engine(ckpt, eviction="sinks", eviction_sinks=4, eviction_window=32).score(text[:1], text[1:])
    assert len(narrow) == len(exact)
    assert narrow[:40] == pytest.approx(exact[:40], abs=1e-4)  # before the first eviction
    assert max(abs(a - b) for a, b in zip(narrow, exact, strict=True)) > 1e-3  # later tokens lost context
