"""The OpenAI logprobs surface as lm-eval and other clients use it: echo + logprobs + max_tokens 0/1
(the loglikelihood idiom) equal the engine's scores (/v1/score's path), a list of prompts answered
in order, generated-token logprobs streamed and not, chat logprobs, and stop lists of any length."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(tiny_model), num_kv_blocks=64, max_model_len=256, show_progress=False))


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json={"model": SERVED_MODEL, **body}, timeout=120)


def stream_events(server: ServerProcess, path: str, body: dict) -> list[dict]:
    events = []
    with httpx.stream("POST", server.base_url + path, json={"model": SERVED_MODEL, "stream": True, **body},
                      timeout=120) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_echo_loglikelihood_batch_equals_the_engines_scores(server: ServerProcess, engine) -> None:
    prompts = [[5, 17, 99, 3, 250, 41], [7, 8, 9], [300, 12, 45, 66, 2, 19, 120, 4]]
    for max_tokens in (0, 1):
        body = {"prompt": prompts, "echo": True, "logprobs": 1, "max_tokens": max_tokens, "temperature": 0}
        response = post(server, "/v1/completions", body)
        assert response.status_code == 200, response.text
        result = response.json()
        assert [c["index"] for c in result["choices"]] == [0, 1, 2]
        assert result["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)
        assert result["usage"]["completion_tokens"] == max_tokens * len(prompts)
        for ids, choice in zip(prompts, result["choices"], strict=True):
            lp = choice["logprobs"]
            assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(ids) + max_tokens
            assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
            want = engine.score(ids[:1], ids[1:])
            assert lp["token_logprobs"][1 : len(ids)] == pytest.approx(want, abs=1e-4)
            assert choice["text"].startswith(engine.tokenizer.decode(ids))
            for value, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True):
                assert len(top) == 1 and max(top.values()) >= value - 1e-6


def test_generated_logprobs_streamed_and_not(server: ServerProcess) -> None:
    body = {"prompt": "Logprobs of what was sampled", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "logprobs": 3}  # fmt: skip
    whole = post(server, "/v1/completions", body).json()["choices"][0]
    lp = whole["logprobs"]
    assert len(lp["token_logprobs"]) == 8 and all(len(t) == 3 for t in lp["top_logprobs"])
    for value, top in zip(lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert value == pytest.approx(max(top.values()), abs=1e-6)  # greedy: the sampled token is the top one
    assert lp["text_offset"][0] == 0 and "".join(lp["tokens"]) == whole["text"]
    streamed = [c for e in stream_events(server, "/v1/completions", body) for c in e["choices"] if c["logprobs"]]
    assert [v for c in streamed for v in c["logprobs"]["token_logprobs"]] == pytest.approx(lp["token_logprobs"])


def test_chat_logprobs(server: ServerProcess) -> None:
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 5, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 2}  # fmt: skip
    choice = post(server, "/v1/chat/completions", body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 5 and "".join(c["token"] for c in content) == choice["message"]["content"]
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] == pytest.approx(c["top_logprobs"][0]["logprob"])
               for c in content)  # fmt: skip
    streamed = [c for e in stream_events(server, "/v1/chat/completions", body) for c in e["choices"] if c["logprobs"]]
    assert [x["logprob"] for c in streamed for x in c["logprobs"]["content"]] == pytest.approx(
        [c["logprob"] for c in content]
    )
    plain = post(server, "/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": None}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_prompt_list_in_order_and_long_stop_list(server: ServerProcess) -> None:
    prompts = ["one two three", "alpha beta", "x y z w"]
    base = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    singles = [post(server, "/v1/completions", {**base, "prompt": p}).json()["choices"][0]["text"] for p in prompts]
    batch = post(server, "/v1/completions", {**base, "prompt": prompts}).json()
    assert [c["text"] for c in batch["choices"]] == singles
    stops = ["\n\n", "Question:", "</s>", "<|im_end|>", "###", "END"]
    response = post(server, "/v1/completions", {**base, "prompt": prompts[0], "stop": stops})
    assert response.status_code == 200, response.text


def test_max_tokens_zero_needs_echo(server: ServerProcess) -> None:
    response = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 0})
    assert response.status_code == 400 and "echo" in response.json()["error"]["message"]


def test_logit_bias_min_tokens_and_penalties(server: ServerProcess, engine) -> None:
    base = {"prompt": [5, 17, 99, 3], "max_tokens": 6, "temperature": 0}
    forced = post(server, "/v1/completions", {**base, "logit_bias": {"42": 100}, "ignore_eos": True}).json()
    assert forced["choices"][0]["text"] == engine.tokenizer.decode([42] * 6)
    eos = str(engine.tokenizer.eos_token_id)
    stop_at_once = post(server, "/v1/completions", {**base, "logit_bias": {eos: 100}}).json()
    assert stop_at_once["choices"][0]["finish_reason"] == "stop"
    assert stop_at_once["usage"]["completion_tokens"] <= 1
    held = post(server, "/v1/completions", {**base, "logit_bias": {eos: 100}, "min_tokens": 3}).json()
    assert held["usage"]["completion_tokens"] >= 3 and held["choices"][0]["finish_reason"] == "stop"
    pair = {**base, "ignore_eos": True, "logit_bias": {"42": 100, "43": 100}}
    plain = post(server, "/v1/completions", pair).json()["choices"][0]["text"]
    assert plain in (engine.tokenizer.decode([42] * 6), engine.tokenizer.decode([43] * 6))  # greedy: one of them
    alternating = post(server, "/v1/completions", {**pair, "frequency_penalty": 2.0}).json()["choices"][0]["text"]
    both = {engine.tokenizer.decode([t]) for t in (42, 43)}
    assert plain != alternating and all(t in alternating for t in both)  # each repeat costs 2: the other wins


def test_n_choices_per_prompt(server: ServerProcess) -> None:
    body = {"prompt": ["first prompt", "second one"], "n": 3, "max_tokens": 5, "temperature": 1.0, "seed": 11,
            "ignore_eos": True}  # fmt: skip
    result = post(server, "/v1/completions", body).json()
    choices = result["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    texts = [c["text"] for c in choices]
    assert len(set(texts[:3])) > 1 and len(set(texts[3:])) > 1  # seed + j: the n samples differ
    assert [c["text"] for c in post(server, "/v1/completions", body).json()["choices"]] == texts  # and repeat
    single = post(server, "/v1/completions", {**body, "prompt": "first prompt", "n": 1}).json()
    assert single["choices"][0]["text"] == texts[0]  # the first of n is the n=1 sample
    second = post(server, "/v1/completions", {**body, "prompt": "second one", "n": 1}).json()
    # each prompt counts once, however many choices it has
    assert result["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"]
    assert result["usage"]["completion_tokens"] == 30
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2,
                                                 "max_tokens": 3, "temperature": 0}).json()  # fmt: skip
    assert [c["index"] for c in chat["choices"]] == [0, 1]
    assert chat["choices"][0]["message"] == chat["choices"][1]["message"]  # greedy: the same
