"""best_of (the n most likely of best_of samples) and n > 1 sharing the prompt's KV blocks through
the prefix cache, against a real `kvpilot serve`."""

from __future__ import annotations

import httpx
import pytest

from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service


def post(server: ServerProcess, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/completions", json={"model": SERVED_MODEL, **body}, timeout=120)


def test_best_of_returns_the_most_likely_samples(server: ServerProcess) -> None:
    body = {"prompt": "Once upon", "max_tokens": 6, "temperature": 1.0, "seed": 11}
    every = post(server, {**body, "n": 4, "logprobs": 0}).json()  # sample j uses seed + j, as best_of's do
    ranked = sorted(every["choices"], key=lambda c: sum(c["logprobs"]["token_logprobs"]), reverse=True)
    best = post(server, {**body, "n": 2, "best_of": 4, "logprobs": 0}).json()
    assert [c["text"] for c in best["choices"]] == [c["text"] for c in ranked[:2]]
    assert [c["index"] for c in best["choices"]] == [0, 1]
    assert best["usage"]["completion_tokens"] == every["usage"]["completion_tokens"]  # all samples count
    plain = post(server, {**body, "best_of": 4}).json()
    assert len(plain["choices"]) == 1 and plain["choices"][0]["logprobs"] is None  # not asked: not returned
    assert plain["choices"][0]["text"] == ranked[0]["text"]


@pytest.mark.parametrize(
    ("extra", "words"),
    [({"n": 3, "best_of": 2}, "must be >= n=3"), ({"best_of": 2, "stream": True}, "cannot stream"),
     ({"best_of": 2, "echo": True}, "echo"), ({"best_of": 100, "prompt": ["a", "b", "c"]}, "best_of=100 is 300")],
)  # fmt: skip
def test_best_of_that_cannot_be_served_is_400(server: ServerProcess, extra: dict, words: str) -> None:
    response = post(server, {"prompt": "x", "max_tokens": 2, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "best_of" and words in error["message"], error


def test_n_samples_share_the_prompts_blocks(server: ServerProcess) -> None:
    prompt = [(7 * i) % 300 + 3 for i in range(150)]  # 150 tokens: 9 full blocks of 16, never seen before
    before = server.stats()["prefix_cache"]["hit_tokens_total"]
    result = post(server, {"prompt": prompt, "n": 4, "max_tokens": 3, "temperature": 1.0, "seed": 1}).json()
    assert len(result["choices"]) == 4 and result["usage"]["prompt_tokens"] == 150
    hits = server.wait_stats(lambda s: s["prefix_cache"]["hit_tokens_total"] >= before + 3 * 144)
    assert hits["prefix_cache"]["hit_tokens_total"] - before == 3 * 144  # 3 followers x 9 full blocks
