"""Structured output over HTTP against a real `kvpilot serve` (tiny random model): OpenAI's
response_format on chat and completions (streamed and not, n > 1), vLLM's guided_* and
structured_outputs, and a 400 naming the field for every bad constraint."""

from __future__ import annotations

import json
import random
import re

import httpx
import jsonschema
import pytest

from tests.helpers.json_schemas import random_schema
from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service

CHAT = {"messages": [{"role": "user", "content": "Describe a user as JSON."}]}


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json={"model": SERVED_MODEL, **body}, timeout=120)


def streamed_text(server: ServerProcess, path: str, body: dict) -> tuple[dict[int, str], dict[int, str]]:
    """Streamed (text by choice index, finish reason by choice index)."""
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    with httpx.stream("POST", server.base_url + path, json={"model": SERVED_MODEL, "stream": True, **body},
                      timeout=120) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                piece = choice["delta"].get("content") if "delta" in choice else choice["text"]
                texts[choice["index"]] = texts.get(choice["index"], "") + (piece or "")
                if choice.get("finish_reason"):
                    reasons[choice["index"]] = choice["finish_reason"]
    return texts, reasons


def test_chat_json_schema_validates_whole_and_streamed(server: ServerProcess) -> None:
    schema = random_schema(random.Random(41))
    fmt = {"type": "json_schema", "json_schema": {"name": "user", "schema": schema, "strict": True}}
    body = {**CHAT, "response_format": fmt, "max_tokens": 200, "temperature": 1.0, "seed": 3, "n": 3}
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert len(choices) == 3
    for choice in choices:
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    texts, reasons = streamed_text(server, "/v1/chat/completions", body)
    assert texts == {c["index"]: c["message"]["content"] for c in choices}  # same seed: same text streamed
    assert set(reasons.values()) == {"stop"}


def test_completions_guided_fields_and_structured_outputs(server: ServerProcess) -> None:
    base = {"prompt": "Pick: ", "max_tokens": 40, "temperature": 1.0, "n": 4, "seed": 9}
    choices = ["red", "green", "dark blue"]
    cases = [
        ({"guided_choice": choices}, lambda t: t in choices),
        ({"structured_outputs": {"choice": choices}}, lambda t: t in choices),
        ({"guided_regex": r"[A-Z][a-z]{2,5} [0-9]{2}"}, lambda t: re.fullmatch(r"[A-Z][a-z]{2,5} [0-9]{2}", t)),
        ({"guided_json": json.dumps({"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"]}),
          "guided_decoding_backend": "xgrammar"}, lambda t: json.loads(t)["k"] in (1, 2)),
        ({"guided_grammar": 'root ::= "<" [a-c]{1,3} ">"'}, lambda t: re.fullmatch(r"<[a-c]{1,3}>", t)),
    ]  # fmt: skip
    for extra, ok in cases:
        response = post(server, "/v1/completions", {**base, **extra})
        assert response.status_code == 200, (extra, response.text)
        for choice in response.json()["choices"]:
            assert choice["finish_reason"] == "stop" and ok(choice["text"]), (extra, choice)
    texts, reasons = streamed_text(server, "/v1/completions", {**base, "guided_choice": choices, "stop": ["zz"]})
    assert all(t in choices for t in texts.values()) and len(texts) == 4, texts
    assert set(reasons.values()) == {"stop"}
    # a stop string inside the constrained text ends it there (as vLLM), streamed and not
    cut = {**base, "guided_choice": ["abcdef"], "stop": ["cd"], "n": 2}
    assert [c["text"] for c in post(server, "/v1/completions", cut).json()["choices"]] == ["ab", "ab"]
    assert streamed_text(server, "/v1/completions", cut) == ({0: "ab", 1: "ab"}, {0: "stop", 1: "stop"})


def test_ignore_eos_keeps_the_constraint_then_runs_to_max_tokens(server: ServerProcess) -> None:
    """vLLM's behaviour, which benchmark clients (inference-perf) rely on: the output follows the
    schema until it is complete, then runs free for exactly max_tokens tokens."""
    schema = {"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "k", "schema": schema}}
    body = {**CHAT, "response_format": fmt, "max_tokens": 50, "temperature": 1.0, "seed": 4, "n": 2,
            "ignore_eos": True}  # fmt: skip
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 100
    for choice in response.json()["choices"]:
        text = choice["message"]["content"]
        value, end = json.JSONDecoder().raw_decode(text)
        jsonschema.validate(value, schema)
        assert choice["finish_reason"] == "length" and text[end:].strip(), text  # free text after the JSON
    texts, reasons = streamed_text(server, "/v1/chat/completions", body)
    assert texts == {c["index"]: c["message"]["content"] for c in response.json()["choices"]}
    assert set(reasons.values()) == {"length"}
    done = post(server, "/v1/completions", {"prompt": "Pick: ", "guided_choice": ["red", "blue"], "max_tokens": 20,
                                            "ignore_eos": True}).json()  # fmt: skip
    assert done["usage"]["completion_tokens"] == 20 and done["choices"][0]["text"].startswith(("red", "blue"))


@pytest.mark.parametrize(
    ("extra", "param", "text"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
         "response_format", "xgrammar cannot compile this json schema: Unsupported type"),
        ({"guided_regex": "(a|b"}, "guided_regex", "xgrammar cannot compile this regex"),
        ({"guided_grammar": "root ::= missing"}, "guided_grammar", 'Rule "missing" is not defined'),
        ({"response_format": {"type": "xml"}}, "response_format", "'xml' is not supported"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "needs 'json_schema'"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "send at most one"),
        ({"guided_choice": []}, "guided_choice", "non-empty list"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs", "structural_tag is not supported"),
        ({"guided_decoding_backend": "outlines", "guided_regex": "a"}, "guided_decoding_backend", "xgrammar"),
    ],
)  # fmt: skip
def test_bad_constraints_are_400_naming_the_field(server: ServerProcess, extra: dict, param: str | None,
                                                  text: str) -> None:  # fmt: skip
    for path, base in (("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "x"})):
        response = post(server, path, {**base, "max_tokens": 5, **extra})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert text in error["message"] and (param is None or error["param"] == param), error
