"""The official `openai` client against a real `kvpilot serve`: chat and text completions, streamed
and not, usage accounting, stop sequences, seeds, and the X-Model-Strategy header."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.service.conftest import SERVED_MODEL, STRATEGY, ServerProcess

pytestmark = pytest.mark.service

PROMPT = "The paged KV cache keeps"
LONG = {"ignore_eos": True}  # the random model may pick EOS at any time; these tests want full lengths


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_health_ready_and_strategy_header(server: ServerProcess, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [SERVED_MODEL]
    assert models.data[0].model_extra["max_model_len"] == 256
    for path in ("/health", "/ready", "/v1/models"):
        response = httpx.get(server.base_url + path)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["X-Model-Strategy"] == STRATEGY
    assert httpx.get(server.base_url + "/ready").json()["status"] == "ready"


def test_completion_non_streaming(client: openai.OpenAI) -> None:
    result = client.completions.create(model=SERVED_MODEL, prompt=PROMPT, max_tokens=12, extra_body=LONG)
    assert result.id.startswith("cmpl-")
    assert result.object == "text_completion"
    assert result.choices[0].finish_reason == "length"
    assert result.choices[0].text
    assert result.usage.completion_tokens == 12
    assert result.usage.prompt_tokens > 0
    assert result.usage.total_tokens == result.usage.prompt_tokens + 12


def test_completion_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    result = client.completions.create(model=SERVED_MODEL, prompt=PROMPT, extra_body=LONG)
    assert result.usage.completion_tokens == 16


def test_completion_streaming_matches_non_streaming_greedy(client: openai.OpenAI) -> None:
    whole = client.completions.create(
        model=SERVED_MODEL, prompt=PROMPT, max_tokens=20, temperature=0, extra_body=LONG
    )
    stream = client.completions.create(
        model=SERVED_MODEL,
        prompt=PROMPT,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=LONG,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert len({c.id for c in chunks}) == 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model=SERVED_MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        max_completion_tokens=8,
        extra_body=LONG,
    )
    assert result.id.startswith("chatcmpl-")
    assert result.object == "chat.completion"
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].finish_reason == "length"
    assert result.usage.completion_tokens == 8
    assert result.system_fingerprint == STRATEGY


def test_chat_streaming_with_and_without_usage(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Count to three"}]
    kwargs = {
        "model": SERVED_MODEL,
        "messages": messages,
        "max_tokens": 10,
        "temperature": 0,
        "extra_body": LONG,
    }
    whole = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens
    plain = list(client.chat.completions.create(stream=True, **kwargs))
    assert all(c.usage is None for c in plain)
    assert "".join(c.choices[0].delta.content or "" for c in plain if c.choices) == text


def test_streamed_chat_with_n_choices_rebuilds_each_message(client: openai.OpenAI) -> None:
    """The SDK's stream helper builds every choice's message from that choice's own deltas: each
    needs its role, and the rebuilt choices equal the whole answer's (same seed)."""
    kwargs = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "Two ways"}], "max_tokens": 6,
              "n": 3, "seed": 11, "temperature": 1.0, "extra_body": LONG}  # fmt: skip
    whole = client.chat.completions.create(**kwargs)
    with client.chat.completions.stream(**kwargs) as stream:  # get_final_completion refuses finish "length"
        for _ in stream:
            pass
        rebuilt = stream.current_completion_snapshot
    assert [c.message.role for c in rebuilt.choices] == ["assistant"] * 3
    assert [(c.index, c.message.content, c.finish_reason) for c in rebuilt.choices] == \
        [(c.index, c.message.content, c.finish_reason) for c in whole.choices]  # fmt: skip


def test_sse_wire_format(server: ServerProcess) -> None:
    body = {"model": SERVED_MODEL, "prompt": PROMPT, "max_tokens": 5, "stream": True, **LONG}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["X-Model-Strategy"] == STRATEGY
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(line[6:]) for line in events[:-1]]
    assert all(p["object"] == "text_completion" for p in payloads)
    assert "usage" not in payloads[0]  # only when stream_options.include_usage asks for it


def test_seed_makes_sampling_repeatable(client: openai.OpenAI) -> None:
    kwargs = {
        "model": SERVED_MODEL,
        "prompt": PROMPT,
        "max_tokens": 16,
        "temperature": 1.0,
        "extra_body": LONG,
    }
    first = client.completions.create(seed=1234, **kwargs).choices[0].text
    again = client.completions.create(seed=1234, **kwargs).choices[0].text
    assert first == again
    others = {client.completions.create(seed=s, **kwargs).choices[0].text for s in (1, 2, 3)}
    assert len(others | {first}) > 1, "different seeds all sampled the same 16 tokens"


def test_stop_sequence_ends_text_and_is_not_returned(client: openai.OpenAI) -> None:
    base = client.completions.create(
        model=SERVED_MODEL, prompt=PROMPT, max_tokens=24, temperature=0, extra_body=LONG
    )
    text = base.choices[0].text
    stop = next((text[i : i + 2] for i in range(2, len(text) - 2) if text[i : i + 2].strip()), None)
    if stop is None:
        pytest.skip(f"greedy text {text!r} has no usable stop sequence")
    cut = text.index(stop)
    for streamed in (False, True):
        kwargs = {"model": SERVED_MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stop": [stop]}
        if streamed:
            chunks = list(client.completions.create(stream=True, extra_body=LONG, **kwargs))
            got = "".join(c.choices[0].text for c in chunks if c.choices)
            reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][
                -1
            ]
        else:
            result = client.completions.create(extra_body=LONG, **kwargs)
            got, reason = result.choices[0].text, result.choices[0].finish_reason
        assert got == text[:cut], (streamed, stop, text)
        assert reason == "stop"


def test_token_id_prompt_equals_text_prompt(tiny_model, client: openai.OpenAI) -> None:
    from kvpilot.engine.tokenizer import Tokenizer

    ids = Tokenizer(tiny_model).encode("abc")
    kwargs = {"model": SERVED_MODEL, "max_tokens": 6, "temperature": 0, "extra_body": LONG}
    by_text = client.completions.create(prompt="abc", **kwargs)
    by_ids = client.completions.create(prompt=ids, **kwargs)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens == len(ids)


def test_repeated_prompt_reports_prefix_cache_hits(client: openai.OpenAI) -> None:
    """A prompt sent again reuses its cached full blocks (block size 16), as usage reports."""
    prompt = "A shared system prompt that spans several KV blocks of sixteen tokens each, " * 2
    first = client.completions.create(model=SERVED_MODEL, prompt=prompt, max_tokens=2, extra_body=LONG)
    second = client.completions.create(model=SERVED_MODEL, prompt=prompt, max_tokens=2, extra_body=LONG)
    prompt_tokens = first.usage.prompt_tokens
    assert prompt_tokens >= 32
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached % 16 == 0 and prompt_tokens - 16 <= cached < prompt_tokens, (cached, prompt_tokens)


def test_capacity_plan_is_printed_and_sizes_the_pool(server: ServerProcess) -> None:
    log = server.log_path.read_text()
    assert "capacity plan (kvpilot.planner):" in log
    assert "cpu-budget" in log and "16 MiB" in log  # --cpu-memory-budget stands in for GPU memory
    planned = int(log.split("KV pool: ")[1].split(" blocks, sized from the plan")[0])
    table_blocks = int(log.split("blocks in pool")[1].split()[0])
    assert planned == table_blocks > 0
    kv = server.stats()["kv"]
    assert kv["blocks_total"] == planned
    assert f"engine ready: {planned} KV blocks of 16 tokens" in log
