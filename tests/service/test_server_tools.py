"""Tool calling over HTTP against a real `kvpilot serve` (tiny random model, whose chat template
renders tools in the Hermes format): tool_choice required and named constrain the output to valid
calls; auto parses the model's <tool_call> blocks; whole and streamed agree; bad requests are 400s."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                            "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}  # fmt: skip
LOOKUP = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["id"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "lookup", "parameters": LOOKUP}}]  # fmt: skip
SCHEMAS = {"get_weather": WEATHER, "lookup": LOOKUP}
BASE = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": TOOLS, "max_tokens": 120,
        "temperature": 1.0, "seed": 5}  # fmt: skip


def post(server: ServerProcess, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/chat/completions", json={"model": SERVED_MODEL, **body}, timeout=120)


def streamed(server: ServerProcess, body: dict) -> dict[int, dict]:
    """Per choice: content, tool calls assembled from their deltas as a client does, finish reason."""
    out: dict[int, dict] = {}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions",
                      json={"model": SERVED_MODEL, "stream": True, **body}, timeout=120) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                got = out.setdefault(choice["index"], {"content": "", "calls": {}, "finish_reason": None})
                delta = choice["delta"]
                got["content"] += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    slot = got["calls"].setdefault(call["index"], {"id": None, "name": None, "arguments": ""})
                    slot["id"] = call.get("id") or slot["id"]
                    slot["name"] = call["function"].get("name") or slot["name"]
                    slot["arguments"] += call["function"].get("arguments") or ""
                got["finish_reason"] = choice["finish_reason"] or got["finish_reason"]
    return out


def check_calls(calls: list[dict]) -> None:
    assert calls
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


def test_required_gives_valid_calls_whole_and_streamed(server: ServerProcess) -> None:
    # one call per choice (parallel_tool_calls false): a random model would append calls until max_tokens
    body = {**BASE, "tool_choice": "required", "n": 2, "parallel_tool_calls": False}
    response = post(server, body)
    assert response.status_code == 200, response.text
    for choice in response.json()["choices"]:
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, choice
        check_calls(choice["message"]["tool_calls"])
        assert len(choice["message"]["tool_calls"]) == 1
    stream = streamed(server, body)
    for choice in response.json()["choices"]:
        got = stream[choice["index"]]
        assert got["finish_reason"] == "tool_calls" and got["content"] == ""
        want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]
        assert [(c["name"], json.loads(c["arguments"])) for c in got["calls"].values()] == want


def test_required_cut_by_max_tokens_gives_the_same_calls_whole_and_streamed(server: ServerProcess) -> None:
    """As OpenAI: a call cut by max_tokens is still a tool call (its arguments as far as they got,
    finish "length"), not the raw JSON fragment as content; whole and streamed agree exactly."""
    body = {**BASE, "tool_choice": "required", "parallel_tool_calls": False}
    full = post(server, body).json()
    (call,) = full["choices"][0]["message"]["tool_calls"]
    for back in range(3, 10):  # the last few tokens close the array: find a cut inside the arguments
        cut = {**body, "max_tokens": full["usage"]["completion_tokens"] - back}
        choice = post(server, cut).json()["choices"][0]
        assert choice["finish_reason"] == "length" and choice["message"]["content"] is None, choice
        (partial,) = choice["message"]["tool_calls"]
        assert partial["id"].startswith("call_") and partial["function"]["name"] == call["function"]["name"]
        arguments = partial["function"]["arguments"]
        assert call["function"]["arguments"].startswith(arguments), (arguments, call)
        if arguments != call["function"]["arguments"]:
            break
    assert arguments and arguments != call["function"]["arguments"], "no cut fell inside the arguments"
    got = streamed(server, cut)[0]
    assert got["finish_reason"] == "length" and got["content"] == ""
    assert [(c["name"], c["arguments"]) for c in got["calls"].values()] == [(call["function"]["name"], arguments)]


def test_ignore_eos_runs_on_after_the_calls(server: ServerProcess) -> None:
    """inference-perf sends ignore_eos with every request: the calls are constrained as without it,
    then the output runs free to max_tokens (as vLLM); that text is the content, whole and streamed."""
    body = {**BASE, "tool_choice": "required", "parallel_tool_calls": False, "ignore_eos": True, "max_tokens": 90}
    response = post(server, body)
    assert response.status_code == 200, response.text
    choice, usage = response.json()["choices"][0], response.json()["usage"]
    assert usage["completion_tokens"] == 90 and choice["finish_reason"] == "length"
    check_calls(choice["message"]["tool_calls"])
    assert choice["message"]["content"], choice  # the free-running text after the array
    got = streamed(server, body)[0]
    assert got["content"] == choice["message"]["content"] and got["finish_reason"] == "length"
    assert [c["arguments"] for c in got["calls"].values()] == [choice["message"]["tool_calls"][0]["function"]["arguments"]]
    named = {**BASE, "tool_choice": {"type": "function", "function": {"name": "lookup"}}, "ignore_eos": True,
             "max_tokens": 40}  # fmt: skip
    message = post(server, named).json()["choices"][0]["message"]
    check_calls(message["tool_calls"])
    got = streamed(server, named)[0]
    assert got["calls"][0]["arguments"] == message["tool_calls"][0]["function"]["arguments"]
    assert got["content"] == (message["content"] or "")


def test_named_function_streams_its_arguments(server: ServerProcess) -> None:
    body = {**BASE, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    response = post(server, body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    check_calls([call])
    got = streamed(server, body)[0]
    assert got["calls"][0]["name"] == "get_weather" and got["calls"][0]["arguments"] == call["function"]["arguments"]


def test_auto_parses_the_models_tool_call_blocks(server: ServerProcess) -> None:
    # The random model never writes a <tool_call> on its own: a regex makes it write one, and the
    # server must find and parse it in the output as it would a real model's.
    regex = r'Sure\. <tool_call>\{"name": "lookup", "arguments": \{"id": [1-9]\}\}</tool_call>'
    body = {**BASE, "tool_choice": "auto", "guided_regex": regex}
    response = post(server, body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Sure."
    check_calls(choice["message"]["tool_calls"])
    got = streamed(server, body)[0]
    assert got["content"] == "Sure. " and got["finish_reason"] == "tool_calls"
    assert [c["arguments"] for c in got["calls"].values()] == [choice["message"]["tool_calls"][0]["function"]["arguments"]]
    plain = post(server, {**BASE, "max_tokens": 8}).json()["choices"][0]  # auto, no call: plain content
    assert "tool_calls" not in plain["message"] and plain["finish_reason"] == "length"


def test_a_conversation_with_tool_results_renders(server: ServerProcess) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"id": 7}'}}
    messages = [{"role": "user", "content": "find 7"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"found\": true}"}]  # fmt: skip
    tokenized = httpx.post(server.base_url + "/tokenize", json={"model": SERVED_MODEL, "messages": messages,
                                                                "tools": TOOLS}, timeout=30)  # fmt: skip
    assert tokenized.status_code == 200, tokenized.text
    text = httpx.post(server.base_url + "/detokenize", json={"tokens": tokenized.json()["tokens"]}, timeout=30)
    rendered = text.json()["prompt"]
    assert "get_weather, lookup" in rendered and '<tool_call>{"name": "lookup", "arguments": {"id": 7}}' in rendered
    assert '{"found": true}' in rendered, rendered
    response = post(server, {**BASE, "messages": messages, "tool_choice": "none", "max_tokens": 4})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == tokenized.json()["count"]
    assert "tool_calls" not in response.json()["choices"][0]["message"]


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "not among the tools"),
     ({"tools": None, "tool_choice": "required"}, "tool_choice", "needs tools"),
     ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
      "constrains the output to tool calls"),
     ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}],
       "tool_choice": "required"}, "tools", "xgrammar cannot compile"),
     ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
         {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": "{oops"}}]}]},
      "messages.0.tool_calls.0.function.arguments", "not valid JSON"),
     ({"functions": [{"name": "f"}]}, "functions", "deprecated"),
     ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "unique")],
)  # fmt: skip
def test_tool_requests_that_cannot_be_served_are_400(server: ServerProcess, extra: dict, param: str,
                                                     words: str) -> None:  # fmt: skip
    response = post(server, {**BASE, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_malformed_tools_are_422(server: ServerProcess) -> None:
    for tools in ([], [{"type": "function", "function": {"name": "has space"}}], [{"type": "retrieval"}]):
        response = post(server, {**BASE, "tools": tools})
        assert response.status_code == 422, response.text
        assert response.json()["error"]["param"].startswith("tools"), response.text


def test_the_openai_client_reads_the_calls(server: ServerProcess) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    kwargs = {"model": SERVED_MODEL, "messages": BASE["messages"], "tools": TOOLS, "max_tokens": 60, "seed": 2,
              "tool_choice": {"type": "function", "function": {"name": "lookup"}}}  # fmt: skip
    message = client.chat.completions.create(**kwargs).choices[0].message
    assert message.tool_calls and message.tool_calls[0].function.name == "lookup"
    jsonschema.validate(json.loads(message.tool_calls[0].function.arguments), LOOKUP)
    arguments = "".join(
        call.function.arguments or ""
        for chunk in client.chat.completions.create(**kwargs, stream=True)
        for call in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else [])
    )
    assert arguments == message.tool_calls[0].function.arguments
