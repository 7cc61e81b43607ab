"""What the parity tests share: prompt sets, greedy runs (LLM or LLMEngine), reference checks, dense logits."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.context import Context, reset_context, set_context
from kvpilot.engine.llm import LLM
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.sampling_params import SamplingParams
from tests.helpers.models import hf_greedy

Reference = tuple[str, list[list[int]]]  # checkpoint path, HF's greedy continuation of each prompt


def mixed_prompts(seed: int = 0) -> list[list[int]]:
    """Lengths 1, 5, 17, 40 and two prompts sharing a 34-token prefix (prefix-cache hits)."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, 384) for _ in range(n)]

    shared = tokens(34)
    return [tokens(1), tokens(5), tokens(17), tokens(40), shared + tokens(3), shared + tokens(5)]


def random_length_prompts(seed: int = 0, n: int = 8) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 384) for _ in range(rng.randrange(8, 48))] for _ in range(n)]


def hf_reference_fixture(build: Callable[[Path, str], Path], prompts: list[list[int]], max_new: int):
    """A module fixture for `@pytest.mark.parametrize("checkpoint", names, indirect=True)`: build(dir,
    name) writes the checkpoint; the fixture gives (path, HF's greedy continuations), built once per
    name (pytest rebuilds a parametrised module fixture whenever its parameter changes)."""
    cache: dict[str, Reference] = {}

    @pytest.fixture(scope="module")
    def checkpoint(request, tmp_path_factory) -> Reference:
        name = request.param
        if name not in cache:
            path = build(tmp_path_factory.mktemp(name), name)
            expected = hf_greedy(path, prompts, max_new)
            assert_varied(expected)
            cache[name] = (str(path), expected)
        return cache[name]

    return checkpoint


def greedy_ids(
    llm: LLM, prompts: list[list[int]], max_tokens: int, ignore_eos: bool = False
) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    return [o["token_ids"] for o in llm.generate(prompts, params)]


def make_engine(model: str | Path, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model), show_progress=False, **kw))


def drain(eng: LLMEngine) -> dict[str, list[int]]:
    """Step until every request finished; the tokens each request produced (by request id)."""
    out: dict[str, list[int]] = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out


def engine_greedy(
    eng: LLMEngine, prompts: list[list[int]], max_tokens: int | list[int], request_ids: list[str] | None = None
) -> list[list[int]]:
    """Greedy continuations (EOS ignored) of prompts run together through the engine's step loop;
    max_tokens is one length for all or one per prompt."""
    ids = request_ids or [str(i) for i in range(len(prompts))]
    lengths = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    for rid, prompt, n in zip(ids, prompts, lengths, strict=True):
        eng.add_request(rid, prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    out = drain(eng)
    return [out.get(rid, []) for rid in ids]


def assert_varied(expected: list[list[int]]) -> None:
    assert any(len(set(e)) > 1 for e in expected), (
        "degenerate reference: every continuation repeats one token"
    )


def assert_replay_and_release(
    llm: LLM, prompts: list[list[int]], expected: list[list[int]], max_tokens: int
) -> None:
    """With prefix caching on, a second greedy pass hits the cache and gives the same tokens; and
    nothing stays held once every request finished."""
    engine = llm.engine
    if engine.config.enable_prefix_caching:
        hits_before = engine.stats()["prefix_cache"]["hit_tokens_total"]
        assert greedy_ids(llm, prompts, max_tokens) == expected
        assert engine.stats()["prefix_cache"]["hit_tokens_total"] > hits_before
    stats = engine.stats()
    assert stats["kv"]["blocks_used"] == 0 and stats["requests"]["running"] == 0


@torch.inference_mode()
def dense_logits(llm: LLM, tokens: list[int]) -> torch.Tensor:
    """Next-token logits at every position of one sequence through the cache-free (dense) path."""
    runner = llm.engine.runner
    set_context(Context(dense=True))
    try:
        hidden = runner.model(torch.tensor(tokens, dtype=torch.long), torch.arange(len(tokens)))
    finally:
        reset_context()
    return runner.model.compute_logits(hidden).float()
