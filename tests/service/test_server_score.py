"""POST /v1/score: per-token log-probabilities of a continuation, equal to the engine's own."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import DEFAULT_FLAGS, SERVED_MODEL, STRATEGY, ServerProcess

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    """The same checkpoint in this process, to compare the server's numbers with."""
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.llm_engine import LLMEngine

    return LLMEngine(
        EngineConfig(model=str(tiny_model), num_kv_blocks=64, max_model_len=256, show_progress=False)
    )


def test_score_returns_the_engines_log_probabilities(server: ServerProcess, engine) -> None:
    body = {"model": SERVED_MODEL, "prompt": "The capital of France is", "continuation": " Paris, of course."}
    response = httpx.post(server.base_url + "/v1/score", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["X-Model-Strategy"] == STRATEGY
    result = response.json()
    logprobs = result["token_logprobs"]
    assert len(logprobs) == len(result["continuation_token_ids"]) == len(result["continuation_tokens"]) >= 2
    assert all(lp < 0 for lp in logprobs)
    assert result["sum_logprob"] == pytest.approx(math.fsum(logprobs), abs=1e-9)

    prompt_ids = engine.tokenizer.encode(body["prompt"])
    assert result["prompt_tokens"] == len(prompt_ids)
    expected = engine.score(prompt_ids, result["continuation_token_ids"])
    assert logprobs == pytest.approx(expected, abs=1e-4)
    assert result["sum_logprob"] == pytest.approx(sum(expected), abs=1e-3)
    assert "".join(result["continuation_tokens"]) == body["continuation"]


def test_greedy_token_scores_highest(server: ServerProcess) -> None:
    """The model's own greedy token is at least as likely as any other single token after the
    prompt: scoring and generation look at the same position."""
    prompt = "Scoring lines up with generation"

    def score(text: str) -> tuple[list[int], float]:
        body = {"model": SERVED_MODEL, "prompt": prompt, "continuation": text}
        result = httpx.post(server.base_url + "/v1/score", json=body, timeout=60).json()
        return result["continuation_token_ids"], result["sum_logprob"]

    greedy = httpx.post(
        server.base_url + "/v1/completions",
        json={"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, "ignore_eos": True},
        timeout=60,
    ).json()["choices"][0]["text"]
    if not greedy or "\ufffd" in greedy:
        pytest.skip(f"the greedy token {greedy!r} is not a whole character, so it cannot be sent as text")
    ids, best = score(greedy)
    if len(ids) != 1:
        pytest.skip("the greedy token re-tokenises into several tokens")
    others = [score(t) for t in ("a", "e", "t", " ", "0", ".", "the") if t != greedy]
    singles = [lp for token_ids, lp in others if len(token_ids) == 1]
    assert len(singles) >= 3
    assert all(best >= lp for lp in singles), (greedy, best, singles)


def test_score_errors(server: ServerProcess) -> None:
    too_long = httpx.post(
        server.base_url + "/v1/score",
        json={"model": SERVED_MODEL, "prompt": "word " * 200, "continuation": " more" * 100},
    )
    assert too_long.status_code == 400
    message = too_long.json()["error"]["message"]
    assert "exceed this model's maximum context length of 256 tokens" in message
    empty = httpx.post(
        server.base_url + "/v1/score", json={"model": SERVED_MODEL, "prompt": "x", "continuation": ""}
    )
    assert empty.status_code == 422 and empty.json()["error"]["param"] == "continuation"
    wrong = httpx.post(
        server.base_url + "/v1/score", json={"model": "other", "prompt": "x", "continuation": "y"}
    )
    assert wrong.status_code == 404


def test_int8_kv_server_scores_what_it_serves(server: ServerProcess, start_server, tiny_model: Path) -> None:
    """An int8-KV canary's /v1/score is not the stable one's: it scores through its own 8-bit cache
    (as the engine in this process with the same flag does), so the rollout's accuracy probe sees it."""
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.llm_engine import LLMEngine

    int8 = start_server(*DEFAULT_FLAGS, "--kv-cache-dtype", "int8")
    body = {"model": SERVED_MODEL, "prompt": "Quantised caches drift a little", "continuation": " over a long answer."}
    stable = httpx.post(server.base_url + "/v1/score", json=body, timeout=60).json()
    canary = httpx.post(int8.base_url + "/v1/score", json=body, timeout=60).json()
    assert canary["continuation_token_ids"] == stable["continuation_token_ids"]
    diffs = [abs(a - b) for a, b in zip(canary["token_logprobs"], stable["token_logprobs"], strict=True)]
    assert max(diffs) > 1e-5, "the int8 server scored exactly like the fp32-cache one"
    assert max(diffs) < 0.05  # int8 per-token scales stay close
    local = LLMEngine(EngineConfig(model=str(tiny_model), kv_cache_dtype="int8", num_kv_blocks=64,
                                   max_model_len=256, show_progress=False))
    prompt_ids = local.tokenizer.encode(body["prompt"])
    assert canary["token_logprobs"] == pytest.approx(local.score(prompt_ids, canary["continuation_token_ids"]), abs=1e-4)
